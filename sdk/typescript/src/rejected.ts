// E-REJECT: the data of an event.rejected (schemas/event.rejected.json)
// within the bounds of events.md, as the Go bus keeps them (internal/bus
// Reject): the body's first 32 KiB with the whole body's size and SHA-256
// when cut, each header name and value to 1 KiB, 64 header values in
// all, the reason's message to 1 KiB; all of it within a quarter of the
// server's max payload (at least 4 KiB), shrunk step by step.
import { createHash } from "node:crypto";

/** Bounds of what a rejection keeps of the original message (Go's bus.MaxRejected*). */
export const MaxRejectedData = 32 << 10;
export const MaxRejectedHeader = 1 << 10;
export const MaxRejectedHeaders = 64;

/** The data of an event.rejected. */
export interface RejectedData {
  reason: { code: string; message: string };
  originalSubject: string;
  originalHeaders?: Record<string, string[]>;
  originalData?: string;
  originalDataBytes?: number;
  originalDataHash?: string;
  consumer: string;
  stream: string;
  streamSequence: number;
}

/** clip keeps the first n UTF-8 bytes of s (whole characters), marking a cut with "…". */
export function clip(s: string, n: number): string {
  const b = Buffer.from(s, "utf8");
  if (b.length <= n) return s;
  let cut = n;
  while (cut > 0 && (b[cut] & 0xc0) === 0x80) cut--;
  return b.subarray(0, cut).toString("utf8") + "…";
}

function boundedHeaders(h: Record<string, string[]> | undefined, valueMax: number, count: number): Record<string, string[]> | undefined {
  if (!h || Object.keys(h).length === 0) return undefined;
  const out: Record<string, string[]> = {};
  let n = 0;
  for (const k of Object.keys(h).sort()) {
    for (const v of h[k]) {
      if (n === count) return out;
      (out[clip(k, valueMax)] ??= []).push(clip(v, valueMax));
      n++;
    }
  }
  return out;
}

/** rejection builds the data of the event.rejected of a work message. */
export function rejection(m: { reason: { code: string; message: string }; subject: string; headers?: Record<string, string[]>; data: Uint8Array;
  consumer: string; stream: string; streamSequence: number; maxPayload: number }): RejectedData {
  const body = Buffer.from(m.data);
  let kept = body;
  let headers = boundedHeaders(m.headers, MaxRejectedHeader, MaxRejectedHeaders);
  let subject = m.subject;
  let message = clip(m.reason.message, MaxRejectedHeader);
  const cut = (n: number) => { if (kept.length > n) kept = kept.subarray(0, n); };
  const build = (): RejectedData => ({
    reason: { code: m.reason.code, message }, originalSubject: subject, originalHeaders: headers,
    originalData: kept.length > 0 ? kept.toString("base64") : undefined,
    ...(kept.length < body.length ? { originalDataBytes: body.length, originalDataHash: createHash("sha256").update(body).digest("hex") } : {}),
    consumer: m.consumer, stream: m.stream, streamSequence: m.streamSequence,
  });
  cut(MaxRejectedData);
  const limit = Math.max(4 << 10, Math.floor((m.maxPayload > 0 ? m.maxPayload : 1 << 20) / 4));
  const fits = () => Buffer.byteLength(JSON.stringify(build()), "utf8") <= limit;
  if (fits()) return build();
  headers = boundedHeaders(headers, 64, 16);
  if (fits()) return build();
  cut(1 << 10);
  if (fits()) return build();
  headers = undefined;
  cut(0);
  subject = clip(subject, 256);
  message = clip(message, 256);
  return build();
}
