// E-IDEMPOTENCY: idempotency reservations in the pool's bucket, in the Go
// executor's record format (executor/idempotency.go): keys
// "<pool>.<tenant>.<sha256 of the key>", values {state: reserved|done,
// callId, executor, reservedAt, timeoutMs, action, tenant, userId,
// inputHash, output, summary, complete}. A reservation is a lease renewed
// every heartbeat; one not renewed for three heartbeats is taken over.
import type { KV } from "@nats-io/kv";
import { Ajv2020 } from "ajv/dist/2020.js";
import { ActionbusError, Codes } from "./errors.js";
import type { Logger, Result } from "./executor.js";
import { joinIssues, schemaIssues } from "./validation.js";

/**
 * RecordSchema is schemas/idempotency-record.json with its two references
 * (action-definition.json#/$defs/name, defs.json#/$defs/tenant) inlined;
 * a test keeps it equal to the file.
 */
export const RecordSchema = {
  type: "object",
  required: ["state", "callId", "executor", "reservedAt", "timeoutMs", "action", "inputHash"],
  properties: {
    state: { enum: ["reserved", "done"] },
    callId: { type: "string", minLength: 1 },
    executor: { type: "string" },
    reservedAt: { type: "string", format: "date-time" },
    timeoutMs: { type: "integer", minimum: 0 },
    action: { type: "string", pattern: "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$" },
    tenant: { type: "string", pattern: "^[a-z0-9][a-z0-9_-]{0,31}$" },
    userId: { type: "string" },
    inputHash: { type: "string" },
    output: {},
    summary: { type: "string" },
    complete: { type: "boolean" },
  },
  additionalProperties: false,
} as const;

const recordAjv = new Ajv2020({ strict: false, allErrors: true, verbose: true });
// RFC 3339 date-time, as Go's time.Time decodes it.
recordAjv.addFormat("date-time", /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/);
const validateRecord = recordAjv.compile(RecordSchema);

const clipKey = (k: string) => (k.length <= 200 ? k : k.slice(0, 200) + "…");

/**
 * decodeRecord reads the idempotency record under key (R-IDEMPOTENCY): one
 * that does not decode or fails the schema is refused with invalid_record
 * (details: record, key, and the schema's issues), never replayed or trusted.
 */
export function decodeRecord(key: string, raw: Uint8Array): IdemEntry {
  const invalid = (msg: string, issues?: unknown) => new ActionbusError(Codes.InvalidRecord,
    `idempotency_record ${clipKey(key)} is invalid: ${msg}`, { record: "idempotency_record", key: clipKey(key), ...(issues ? { issues } : {}) });
  let v: unknown;
  try {
    v = JSON.parse(Buffer.from(raw).toString("utf8"));
  } catch (err) {
    throw invalid(`not a JSON document: ${(err as Error).message}`);
  }
  if (!validateRecord(v)) {
    const issues = schemaIssues(validateRecord.errors);
    throw invalid(joinIssues(issues), issues);
  }
  return v as IdemEntry;
}

/** IdemEntry is what the bucket holds under a key. */
export interface IdemEntry {
  state: "reserved" | "done";
  callId: string;
  executor: string;
  reservedAt: string;
  timeoutMs: number;
  action: string;
  tenant?: string;
  userId?: string;
  inputHash: string;
  output?: unknown;
  summary?: string;
  complete?: boolean;
}

/** Claim is a reservation held by this executor. */
export interface Claim {
  kind: "claimed";
  /** complete stores the result under the key (state done). */
  complete(res: Result): Promise<void>;
  /** release gives the key up so a retry runs again. */
  release(): Promise<void>;
}

export type Reservation = Claim | { kind: "stored"; entry: IdemEntry } | { kind: "wait"; waitMs: number };

const enc = (v: unknown) => Buffer.from(JSON.stringify(v), "utf8");

/** sameCall refuses a key held for another action, user, tenant or input: idempotency_key_conflict. */
export function sameCall(held: IdemEntry, want: IdemEntry): ActionbusError | undefined {
  const differs: string[] = [];
  if (held.action !== want.action) differs.push("action");
  if ((held.userId ?? "") !== (want.userId ?? "")) differs.push("user");
  if ((held.tenant ?? "") !== (want.tenant ?? "")) differs.push("tenant");
  if (held.inputHash !== want.inputHash) differs.push("input");
  if (differs.length === 0) return undefined;
  return new ActionbusError(Codes.IdempotencyConflict,
    `the idempotency key was first used by another call (different ${differs.join(", ")}); use a new key`, { differs });
}

export class Idempotency {
  constructor(private readonly kv: KV, private readonly heartbeatMs: () => number, private readonly log: Logger) {}

  /**
   * reserve claims key for entry, or returns the stored result to replay,
   * or how long to wait for the holder. A key held for another call throws
   * idempotency_key_conflict.
   */
  async reserve(key: string, entry: IdemEntry): Promise<Reservation> {
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        const rev = await this.kv.create(key, enc(entry));
        return this.claimed(key, rev, entry);
      } catch (err) {
        const cur = await this.kv.get(key);
        if (!cur || cur.operation !== "PUT") {
          if (!cur) throw err;
          continue; // released meanwhile
        }
        const held = decodeRecord(key, cur.value); // R-IDEMPOTENCY
        const conflict = sameCall(held, entry);
        if (conflict) throw conflict;
        if (held.state === "done") return { kind: "stored", entry: held };
        const staleAt = Date.parse(held.reservedAt) + 3 * this.heartbeatMs();
        if (staleAt > Date.now()) return { kind: "wait", waitMs: staleAt - Date.now() };
        this.log.warn("taking over an abandoned idempotency reservation; the handler runs again with the same key",
          { callId: entry.callId, previousExecutor: held.executor });
        try {
          const rev = await this.kv.update(key, enc(entry), cur.revision);
          return this.claimed(key, rev, entry);
        } catch {
          continue;
        }
      }
    }
    throw new Error("idempotency key contended");
  }

  private claimed(key: string, rev: number, entry: IdemEntry): Claim {
    let revision = rev;
    let chain = Promise.resolve();
    // The lease: renewed every heartbeat while the handler runs.
    const timer = setInterval(() => {
      chain = chain.then(async () => {
        try {
          revision = await this.kv.update(key, enc({ ...entry, reservedAt: new Date().toISOString() }), revision);
        } catch (err) {
          this.log.warn("idempotency lease not renewed", { callId: entry.callId, err: String(err) });
        }
      });
    }, this.heartbeatMs());
    const stop = async () => {
      clearInterval(timer);
      await chain;
      return revision;
    };
    return {
      kind: "claimed",
      complete: async (res: Result) => {
        const rev = await stop();
        await this.kv.update(key, enc({ ...entry, state: "done", output: res.output, summary: res.summary || undefined,
          complete: res.complete || undefined }), rev);
      },
      release: async () => {
        const rev = await stop();
        try {
          await this.kv.delete(key, { previousSeq: rev });
        } catch (err) {
          this.log.warn("idempotency key not released", { err: String(err) });
        }
      },
    };
  }
}
