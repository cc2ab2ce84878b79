// Event ids: ULIDs (48-bit millisecond timestamp, 80 bits of entropy) in
// Crockford base32, and the derived ids of events.DerivedID / events.ResultID.
import { createHash, randomBytes } from "node:crypto";

const ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

function encode(bytes: Uint8Array): string {
  let n = 0n;
  for (const b of bytes) n = (n << 8n) | BigInt(b);
  let out = "";
  for (let i = 0; i < 26; i++) {
    out = ALPHABET[Number(n & 31n)] + out;
    n >>= 5n;
  }
  return out;
}

/** ulidTime returns the millisecond timestamp of a ULID, or undefined when s is not one (strict: 26 Crockford characters, at most 7ZZZ…). */
export function ulidTime(s: string): number | undefined {
  const u = s.toUpperCase();
  if (u.length !== 26 || u[0] > "7") return undefined;
  let n = 0n;
  for (const c of u) {
    const v = ALPHABET.indexOf(c);
    if (v < 0) return undefined;
    n = (n << 5n) | BigInt(v);
  }
  return Number(n >> 80n);
}

function ulid(time: number, entropy: Uint8Array): string {
  const b = new Uint8Array(16);
  let t = BigInt(time);
  for (let i = 5; i >= 0; i--) {
    b[i] = Number(t & 0xffn);
    t >>= 8n;
  }
  b.set(entropy.subarray(0, 10), 6);
  return encode(b);
}

/** newId returns a fresh ULID for a new fact (a new run). */
export function newId(): string {
  return ulid(Date.now(), randomBytes(10));
}

/** validRunId reports whether s is a run id (a ULID). */
export function validRunId(s: string): boolean {
  return ulidTime(s) !== undefined && s === s.toUpperCase();
}

/**
 * derivedId is events.DerivedID: the ULID whose timestamp is cause's own
 * (0 when cause is no ULID) and whose entropy is the first 10 bytes of
 * SHA-256(cause || 0x00 || part1 || 0x00 || part2 …), integers in decimal.
 */
export function derivedId(cause: string, ...parts: (string | number)[]): string {
  const h = createHash("sha256");
  h.update(cause, "utf8");
  for (const p of parts) {
    h.update(Buffer.from([0]));
    if (typeof p === "number") {
      if (!Number.isSafeInteger(p)) throw new TypeError("derivedId: a number part must be an integer");
      h.update(String(p), "utf8");
    } else {
      h.update(p, "utf8");
    }
  }
  return ulid(ulidTime(cause) ?? 0, h.digest());
}

/**
 * resultId is events.ResultID (rule E-RESULT-ID): the id, and Nats-Msg-Id,
 * of every result for call callId at attempt, so that a call answered
 * twice is stored once.
 */
export function resultId(callId: string, attempt: number): string {
  return derivedId(callId, "result", attempt);
}
