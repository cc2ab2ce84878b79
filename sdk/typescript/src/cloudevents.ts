// The CloudEvents NATS binding as actionbus uses it (docs/events.md, "Wire
// format"): binary mode out (every attribute a percent-encoded ce- header,
// the data the body, Nats-Msg-Id the event id); binary or structured mode in.
import { headers as natsHeaders, type MsgHdrs } from "@nats-io/transport-node";
import { ActionbusError, Codes } from "./errors.js";

/** Event is a decoded CloudEvent with JSON data. */
export interface Event<T = unknown> {
  id: string;
  type: string;
  source: string;
  time?: string;
  dataschema?: string;
  /** Extensions (runid, tenant, cycle, planindex, attempt, pool, …), as strings. */
  extensions: Record<string, string>;
  data: T;
}

/** The base of every schema's $id (dataschema). */
export const SchemaBase = "https://actionbus.dev/schemas/";

/** eventTypes are the types this SDK publishes or reads, with their schema file. */
export const Types = {
  RunRequested: "io.actionbus.run.requested",
  RunCompleted: "io.actionbus.run.completed",
  RunFailed: "io.actionbus.run.failed",
  RunCanceled: "io.actionbus.run.canceled",
  RunStarted: "io.actionbus.run.started",
  RunProgress: "io.actionbus.run.progress",
  RunStep: "io.actionbus.run.step",
  CancelRequested: "io.actionbus.cancel.requested",
  ActionRequested: "io.actionbus.action.requested",
  ActionCompleted: "io.actionbus.action.completed",
  ActionFailed: "io.actionbus.action.failed",
  EventRejected: "io.actionbus.event.rejected",
  PoolAnnounced: "io.actionbus.pool.announced",
  ApprovalRequested: "io.actionbus.approval.requested",
  ApprovalGranted: "io.actionbus.approval.granted",
  ApprovalResolved: "io.actionbus.approval.resolved",
} as const;

/** schemaURL is the dataschema of an event type: its schema file under SchemaBase. */
export function schemaURL(type: string): string {
  return SchemaBase + type.replace(/^io\.actionbus\./, "") + ".json";
}

function needsEscape(c: number): boolean {
  return c < 0x21 || c > 0x7e || c === 0x22 || c === 0x25;
}

/** percentEncode escapes space, '"', '%' and every byte outside printable ASCII as %XY. */
export function percentEncode(s: string): string {
  const b = Buffer.from(s, "utf8");
  let out = "";
  for (const c of b) out += needsEscape(c) ? "%" + c.toString(16).toUpperCase().padStart(2, "0") : String.fromCharCode(c);
  return out;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** percentDecode undoes RFC 7230 quoting, then percent-encoding; invalid UTF-8 is malformed_event. */
export function percentDecode(v: string): string {
  if (v.length >= 2 && v.startsWith('"') && v.endsWith('"')) v = v.slice(1, -1).replace(/\\(.)/g, "$1");
  const bytes: number[] = [];
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c === 0x25 && /^[0-9a-fA-F]{2}$/.test(v.slice(i + 1, i + 3))) {
      bytes.push(parseInt(v.slice(i + 1, i + 3), 16));
      i += 2;
    } else if (c < 0x80) {
      bytes.push(c);
    } else {
      bytes.push(...Buffer.from(v[i], "utf8"));
    }
  }
  try {
    return utf8.decode(new Uint8Array(bytes));
  } catch {
    throw new ActionbusError(Codes.MalformedEvent, "a ce- header is not valid UTF-8");
  }
}

/** Outgoing is an event to publish in binary mode. */
export interface Outgoing {
  id: string;
  type: string;
  source: string;
  extensions?: Record<string, string | number | undefined>;
  data: unknown;
}

/** encode returns the headers and body of e in binary mode, with Nats-Msg-Id set to its id. */
export function encode(e: Outgoing): { headers: MsgHdrs; body: Uint8Array } {
  const h = natsHeaders();
  h.set("Nats-Msg-Id", e.id);
  const set = (name: string, v: string) => h.set("ce-" + name, percentEncode(v));
  set("specversion", "1.0");
  set("id", e.id);
  set("source", e.source);
  set("type", e.type);
  set("datacontenttype", "application/json");
  set("dataschema", schemaURL(e.type));
  set("time", new Date().toISOString());
  for (const [k, v] of Object.entries(e.extensions ?? {})) {
    if (v !== undefined && v !== "") set(k, String(v));
  }
  return { headers: h, body: Buffer.from(JSON.stringify(e.data), "utf8") };
}

const jsonTypes = new Set(["", "application/json", "text/json"]);

/**
 * decode reads a CloudEvent from a NATS message in binary or structured
 * mode. A message that is no valid event is an ActionbusError
 * (malformed_event, or unsupported_content_type for data that is not JSON).
 */
export function decode(hdrs: MsgHdrs | undefined, body: Uint8Array): Event {
  const ct = hdrs?.get("Content-Type")?.toLowerCase() ?? "";
  if (ct === "application/cloudevents" || ct === "application/cloudevents+json") {
    let o: Record<string, unknown>;
    try {
      o = JSON.parse(Buffer.from(body).toString("utf8"));
    } catch {
      throw new ActionbusError(Codes.MalformedEvent, "a structured event is not JSON");
    }
    const ext: Record<string, string> = {};
    const known = new Set(["specversion", "id", "source", "type", "time", "dataschema", "datacontenttype", "subject", "data", "data_base64"]);
    for (const [k, v] of Object.entries(o)) if (!known.has(k)) ext[k] = String(v);
    let data = o.data;
    if (typeof o.data_base64 === "string") data = JSON.parse(Buffer.from(o.data_base64, "base64").toString("utf8"));
    return check({ id: String(o.id ?? ""), type: String(o.type ?? ""), source: String(o.source ?? ""), time: o.time as string | undefined,
      dataschema: o.dataschema as string | undefined, extensions: ext, data }, String(o.specversion ?? ""), String(o.datacontenttype ?? ""));
  }
  const attrs: Record<string, string> = {};
  for (const k of hdrs?.keys() ?? []) {
    const lk = k.toLowerCase();
    if (lk.startsWith("ce-")) attrs[lk.slice(3)] = percentDecode(hdrs!.get(k));
  }
  const { specversion = "", id = "", source = "", type = "", time, dataschema, datacontenttype = "", subject: _s, ...ext } = attrs;
  let data: unknown;
  const text = Buffer.from(body).toString("utf8");
  if (text.length > 0) {
    if (!jsonTypes.has(datacontenttype.split(";")[0].trim().toLowerCase())) {
      throw new ActionbusError("unsupported_content_type", `data of content type ${datacontenttype} is not supported by this SDK`);
    }
    try {
      data = JSON.parse(text);
    } catch {
      throw new ActionbusError(Codes.MalformedEvent, "the data is not JSON");
    }
  }
  return check({ id, type, source, time, dataschema, extensions: ext, data }, specversion, datacontenttype);
}

function check(e: Event, specversion: string, _ct: string): Event {
  if (specversion !== "1.0") throw new ActionbusError(Codes.MalformedEvent, `specversion ${JSON.stringify(specversion)} is not 1.0`);
  if (!e.id || !e.type || !e.source) throw new ActionbusError(Codes.MalformedEvent, "an event needs id, type and source");
  for (const k of Object.keys(e.extensions)) {
    if (!/^[a-z0-9]+$/.test(k)) throw new ActionbusError(Codes.MalformedEvent, `extension name ${JSON.stringify(k)} is not lower-case letters and digits`);
  }
  return e;
}
