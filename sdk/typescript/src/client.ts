// The client side (rules C-START, C-FOLLOW, C-WAIT, C-APPROVE, C-AUDIT):
// start runs, follow their events, wait for their end, approve calls and
// read stored events through the read service ({prefix}.api.{tenant}.{op}).
import { createHmac } from "node:crypto";
import type { NatsConnection, Msg, MsgHdrs } from "@nats-io/transport-node";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import { ActionbusError, Codes } from "./errors.js";
import { decode, encode, Types, type Event } from "./cloudevents.js";
import { newId, validRunId } from "./ids.js";
import { canonicalJSON } from "./canonical.js";
import { tenantOr, type ApprovalContext } from "./wire.js";

/** ClientConfig configures a {@link Client}. */
export interface ClientConfig {
  /** The tenant whose runs the client starts; default "default". It must be the tenant the connection's user may publish for. */
  tenant?: string;
  /** Subject prefix; default "ab". */
  prefix?: string;
  /** ce-source of what the client publishes; default "/actionbus/client/ts". */
  source?: string;
}

/** RunRequest is the data of a run.requested (schemas/run.requested.json) without runId and tenant. */
export interface RunRequest {
  prompt?: string;
  scenario?: string;
  workflow?: Record<string, unknown>;
  action?: { name: string; args?: Record<string, unknown>; idempotencyKey?: string };
  userId?: string;
  allowedModes?: string[];
  metadata?: Record<string, unknown>;
  deadlineMs?: number;
  /** The run id; default a fresh ULID. */
  runId?: string;
}

/** RunOutcome is how a run completed (run.completed's data). */
export interface RunOutcome {
  runId: string;
  answer?: string;
  output?: unknown;
  cycles: number;
  [k: string]: unknown;
}

/** AuditRecord is one audit record (schemas/audit.recorded.json): kind, action, status, eventType, hashes, … */
export interface AuditRecord {
  runId: string;
  kind: string;
  eventId: string;
  eventType: string;
  action?: string;
  status?: string;
  [k: string]: unknown;
}

const terminal = new Set([Types.RunCompleted, Types.RunFailed, Types.RunCanceled] as string[]);

/** outcomeOf returns a terminal event's outcome: the completed data, or throws the run's error (run.failed's code; canceled). */
export function outcomeOf(ev: Event): RunOutcome {
  const d = ev.data as Record<string, unknown>;
  if (ev.type === Types.RunFailed) throw ActionbusError.from(d.error);
  if (ev.type === Types.RunCanceled) throw new ActionbusError(Codes.Canceled, `run canceled${d.reason ? ": " + String(d.reason) : ""}`);
  return d as RunOutcome;
}

/** How long a follower reads the stored events before it yields the terminal event (a read service restarting must not hold up the end). */
const fillBoundMs = 2_000;

/**
 * A live queue of decoded events, consumed as an async iterator.
 *
 * Live messages of a run come from several publishers (the executors'
 * results, the dispatcher's events), and the server does not order one
 * publisher's message against another's: a terminal event can overtake a
 * result, and a connection moving to another server loses what was in
 * flight. So before it yields the terminal event, the queue reads the
 * run's stored events (fill) and yields each one it has not yet yielded,
 * in stored order, then the live events queued behind the end, as the Go
 * client's Follow does.
 */
class EventQueue implements AsyncIterable<Event> {
  private items: Event[] = [];
  private waiting?: (v: void) => void;
  private closed = false;
  /** Ids queued (a live copy and a stored copy of an event are one event). */
  private seen = new Set<string>();
  /** Ids yielded. */
  private yielded = new Set<string>();
  private endResolve!: (ev: Event) => void;
  /** Resolves with the run's terminal event, once it arrives. */
  readonly ended = new Promise<Event>((r) => (this.endResolve = r));

  constructor(private fill?: () => Promise<Event[]>) {}

  /** pushStored queues events read from the stream; when they hold the terminal event, there is nothing left to fill. */
  pushStored(evs: Event[]): void {
    for (const ev of evs) this.push(ev);
    if (evs.some((ev) => terminal.has(ev.type))) this.fill = undefined;
  }

  push(ev: Event): void {
    if (this.closed) return;
    // run.progress carries several steps under one id; dedupe the others by id.
    const key = idOf(ev);
    if (key && this.seen.has(key)) return;
    if (key) this.seen.add(key);
    this.items.push(ev);
    if (terminal.has(ev.type)) this.endResolve(ev);
    this.waiting?.();
  }

  close(): void {
    this.closed = true;
    this.waiting?.();
  }

  /**
   * beforeEnd returns what is to be yielded before the terminal event:
   * the stored events not yet yielded, in stored order (none when the
   * read fails or takes longer than fillBoundMs: the live events are then
   * all there is), then the live ones queued behind the end; never a
   * second terminal event.
   */
  private async beforeEnd(): Promise<Event[]> {
    const behind = this.items.filter((ev) => !terminal.has(ev.type));
    this.items = [];
    let stored: Event[] = [];
    if (this.fill) {
      let timer: NodeJS.Timeout | undefined;
      const bound = new Promise<Event[]>((r) => { timer = setTimeout(() => r([]), fillBoundMs); });
      try {
        stored = await Promise.race([this.fill().catch(() => [] as Event[]), bound]);
      } finally {
        clearTimeout(timer);
      }
    }
    const out: Event[] = [];
    const taken = new Set<string>();
    for (const ev of [...stored, ...behind]) {
      const key = idOf(ev);
      if (terminal.has(ev.type) || (key && (this.yielded.has(key) || taken.has(key)))) continue;
      if (key) taken.add(key);
      out.push(ev);
    }
    return out;
  }

  private mark(ev: Event): Event {
    const key = idOf(ev);
    if (key) this.yielded.add(key);
    return ev;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Event> {
    for (;;) {
      while (this.items.length > 0) {
        const ev = this.items.shift()!;
        if (terminal.has(ev.type)) {
          this.closed = true; // what comes live from here on is read from the stream
          for (const before of await this.beforeEnd()) yield this.mark(before);
          yield this.mark(ev);
          return;
        }
        yield this.mark(ev);
      }
      if (this.closed) return;
      await new Promise<void>((r) => (this.waiting = r));
      this.waiting = undefined;
    }
  }
}

/** idOf is the id an event is deduplicated by: none for run.progress, which carries several steps under one id. */
const idOf = (ev: Event): string => (ev.type === Types.RunProgress ? "" : ev.id);

/** RunHandle is a run just started: its events, followed since before it started, and its end. */
export interface RunHandle {
  runId: string;
  /** Every event of the run (live ones included), ending with its terminal event (C-FOLLOW). */
  events: AsyncIterable<Event>;
  /** Resolves with the completed outcome, or rejects with the run's ActionbusError (C-WAIT). */
  result(): Promise<RunOutcome>;
  /** Stops following (the run goes on). */
  close(): void;
}

/** Client starts and follows runs of one tenant. */
export class Client {
  private readonly nc: NatsConnection;
  private readonly js: JetStreamClient;
  readonly tenant: string;
  private readonly prefix: string;
  private readonly source: string;

  constructor(nc: NatsConnection, cfg: ClientConfig = {}) {
    this.nc = nc;
    this.js = jetstream(nc);
    this.tenant = tenantOr(cfg.tenant);
    this.prefix = cfg.prefix || "ab";
    this.source = cfg.source || "/actionbus/client/ts";
  }

  private runSubject(runId: string, verb: string): string {
    return `${this.prefix}.run.${this.tenant}.${runId}.${verb}`;
  }

  private async publish(subject: string, id: string, type: string, runId: string, data: unknown): Promise<void> {
    const { headers, body } = encode({ id, type, source: this.source, extensions: { runid: runId, tenant: this.tenant }, data });
    await this.js.publish(subject, body, { headers });
  }

  // Live events of a run: subscribed before anything is published.
  private async live(runId: string, fill = true): Promise<{ queue: EventQueue; stop: () => void }> {
    const queue = new EventQueue(fill ? () => this.storedEvents(runId, "runs", Date.now() + fillBoundMs) : undefined);
    const sub = this.nc.subscribe(`${this.prefix}.run.${this.tenant}.${runId}.*`, {
      callback: (err, m) => {
        if (err) return queue.close();
        const ev = tryDecode(m);
        if (ev) queue.push(ev);
      },
    });
    await this.nc.flush();
    return { queue, stop: () => { sub.unsubscribe(); queue.close(); } };
  }

  /**
   * run publishes a run.requested (C-START) on
   * {prefix}.run.{tenant}.{runId}.requested, in binary mode with
   * Nats-Msg-Id the run id, after subscribing to the run's events, so that
   * none is missed.
   */
  async run(req: RunRequest): Promise<RunHandle> {
    const runId = req.runId ?? newId();
    if (!validRunId(runId)) throw new ActionbusError("invalid_run_id", `${runId} is not a ULID`);
    const { runId: _r, ...rest } = req;
    const sub = await this.live(runId);
    const { queue, stop } = sub;
    try {
      await this.publish(this.runSubject(runId, "requested"), runId, Types.RunRequested, runId, { ...rest, runId, tenant: this.tenant });
    } catch (err) {
      stop();
      throw err;
    }
    let ended: Promise<RunOutcome> | undefined;
    void queue.ended.then(() => sub.stop());
    const events = queue;
    return {
      runId,
      events,
      result: () => (ended ??= queue.ended.then((ev) => outcomeOf(ev))),
      close: stop,
    };
  }

  /**
   * follow yields every event of a run that exists already: the stored
   * ones first (read service, events), then each new one, ending with the
   * terminal event (C-FOLLOW). Live events (run.started, run.progress)
   * are seen only while following.
   */
  follow(runId: string, opts: { signal?: AbortSignal } = {}): AsyncIterable<Event> {
    return this.following(runId, opts, true);
  }

  /** following is follow; without fill, an end that comes live is yielded without reading what the stream holds before it. */
  private following(runId: string, opts: { signal?: AbortSignal }, fill: boolean): AsyncIterable<Event> {
    const self = this;
    return {
      async *[Symbol.asyncIterator]() {
        const { queue, stop } = await self.live(runId, fill);
        opts.signal?.addEventListener("abort", stop, { once: true });
        try {
          queue.pushStored(await self.storedEvents(runId));
          for await (const ev of queue) yield ev;
        } finally {
          stop();
        }
      },
    };
  }

  /** wait returns a run's outcome once it ends (C-WAIT): the completed data, or rejects with the failed run's ActionbusError. */
  async wait(runId: string, opts: { signal?: AbortSignal } = {}): Promise<RunOutcome> {
    // Only the end matters here: no read of the stream before it.
    for await (const ev of this.following(runId, opts, false)) if (terminal.has(ev.type)) return outcomeOf(ev);
    throw new ActionbusError(Codes.Canceled, "stopped waiting before the run ended");
  }

  /** cancel asks the dispatcher to cancel a run (cancel.requested). */
  async cancel(runId: string, reason = ""): Promise<void> {
    await this.publish(this.runSubject(runId, "cancel"), newId(), Types.CancelRequested, runId, { runId, reason: reason || undefined });
  }

  /**
   * storedEvents reads the stored events of a run (stream "runs", what the
   * services published) through the read service, in order; a read
   * service that does not answer is asked again for up to 15 s, or until
   * deadline (milliseconds since the epoch) when one is given.
   */
  async storedEvents(runId: string, stream: "runs" | "requests" = "runs", deadline?: number): Promise<Event[]> {
    const out: Event[] = [];
    await this.scan("events", { run: runId, stream }, (m) => { const ev = tryDecodeStored(m); if (ev) out.push(ev); }, deadline);
    return out;
  }

  /**
   * auditRecords reads the audit records of a run through the read
   * service (C-AUDIT), in stream order: the records of each
   * audit.appended, and each older audit.recorded. The auditor writes them
   * moments after the events, so a run that has just ended may not have
   * all of them yet.
   */
  async auditRecords(runId: string): Promise<AuditRecord[]> {
    const out: AuditRecord[] = [];
    await this.scan("audit", { run: runId }, (m) => {
      const ev = tryDecodeStored(m);
      if (ev?.type === "io.actionbus.audit.appended") out.push(...((ev.data as { records?: AuditRecord[] }).records ?? []));
      else if (ev?.type === "io.actionbus.audit.recorded") out.push(ev.data as AuditRecord);
    });
    return out;
  }

  /** scan pages through one read-service operation. */
  private async scan(op: string, req: Record<string, unknown>, fn: (m: StoredMsg) => void, deadline?: number): Promise<void> {
    let after = 0;
    for (;;) {
      const page = await this.call<{ msgs?: StoredMsg[]; next: number; more: boolean }>(op, { ...req, after: after || undefined }, deadline);
      for (const m of page.msgs ?? []) {
        after = m.seq;
        fn(m);
      }
      if (!page.more) return;
      if (page.next > after) after = page.next;
    }
  }

  /** call asks the read service, again while it does not answer, until deadline (default 15 s from now) or the connection closes. */
  private async call<T>(op: string, req: Record<string, unknown>, deadline = Date.now() + 15_000): Promise<T> {
    const body = Buffer.from(JSON.stringify(req), "utf8");
    const subject = `${this.prefix}.api.${this.tenant}.${op}`;
    for (let wait = 50; ; wait = Math.min(2 * wait, 1000)) {
      try {
        const m = await this.nc.request(subject, body, { timeout: Math.max(1, Math.min(15_000, deadline - Date.now())) });
        const code = m.headers?.get("Nats-Service-Error-Code");
        const text = Buffer.from(m.data).toString("utf8");
        if (code) {
          try { throw ActionbusError.from(JSON.parse(text)); } catch (e) {
            if (e instanceof ActionbusError && e.code !== Codes.Internal) throw e;
            throw new ActionbusError(code, m.headers?.get("Nats-Service-Error") ?? "");
          }
        }
        return JSON.parse(text) as T;
      } catch (err) {
        if (err instanceof ActionbusError || Date.now() + wait > deadline || this.nc.isClosed()) throw err;
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  /**
   * approve grants a pending approval (C-APPROVE): it reads the approval
   * request (read service, approvals), signs its context with the
   * approver's key (HMAC-SHA256 over the context's RFC 8785 form,
   * expiresAt in whole seconds: policy.Sign) and publishes approval.granted,
   * then waits for the dispatcher's answer. It rejects with an
   * ActionbusError: approval_not_found, or the dispatcher's refusal
   * (approval_invalid, approval_replayed, approval_expired).
   */
  async approve(approvalId: string, keyId: string, key: Uint8Array, opts: { timeoutMs?: number } = {}): Promise<void> {
    const runId = approvalId.split("-")[0];
    if (!validRunId(runId)) throw new ActionbusError("invalid_run_id", `${approvalId} is not an approval id`);
    let ctx: ApprovalContext | undefined;
    const deadline = Date.now() + 5_000;
    for (let wait = 20; !ctx; wait = Math.min(2 * wait, 250)) {
      await this.scan("approvals", { run: runId }, (m) => {
        const ev = tryDecodeStored(m);
        const d = ev?.data as { context?: ApprovalContext } | undefined;
        if (ev?.type === Types.ApprovalRequested && d?.context?.approvalId === approvalId) ctx = d.context;
      });
      if (ctx) break;
      if (Date.now() > deadline) throw new ActionbusError(Codes.ApprovalNotFound, `no approval request ${approvalId} in tenant ${this.tenant}`, { approvalId });
      await new Promise((r) => setTimeout(r, wait));
    }
    const token = signApproval(keyId, key, ctx!);
    const answerId = newId();
    let settle!: (e?: ActionbusError) => void;
    const answered = new Promise<ActionbusError | undefined>((r) => (settle = r));
    const sub = this.nc.subscribe(this.runSubject(runId, "approval"), {
      callback: (_e, m) => {
        const ev = tryDecode(m);
        const d = ev?.data as { answerId?: string; outcome?: string; error?: unknown } | undefined;
        if (ev?.type !== Types.ApprovalResolved || d?.answerId !== answerId) return;
        settle(d.outcome === "refused" ? ActionbusError.from(d.error) : undefined);
      },
    });
    try {
      await this.nc.flush();
      await this.publish(this.runSubject(runId, "approve"), answerId, Types.ApprovalGranted, runId,
        { runId, approvalId, token, approver: keyId, context: ctx });
      const timeout = new Promise<ActionbusError>((r) => setTimeout(() => r(new ActionbusError(Codes.Timeout, "no answer from the dispatcher to the approval")), opts.timeoutMs ?? 30_000).unref());
      const err = await Promise.race([answered, timeout]);
      if (err) throw err;
    } finally {
      sub.unsubscribe();
    }
  }
}

/** signApproval is policy.Sign: "<kid>.<base64url HMAC-SHA256 of the context's canonical JSON>", expiresAt cut to whole seconds, UTC. */
export function signApproval(keyId: string, key: Uint8Array, ctx: ApprovalContext): string {
  const expires = new Date(Math.floor(Date.parse(ctx.expiresAt) / 1000) * 1000).toISOString().replace(".000Z", "Z");
  const c: Record<string, unknown> = { ...ctx, expiresAt: expires };
  for (const k of ["resourceIds", "dryRunHash", "dryRunAction"]) {
    const v = c[k];
    if (v === undefined || v === "" || (Array.isArray(v) && v.length === 0)) delete c[k];
  }
  const mac = createHmac("sha256", key).update(canonicalJSON(c), "utf8").digest("base64url");
  return `${keyId}.${mac}`;
}

interface StoredMsg {
  seq: number;
  subject: string;
  header?: Record<string, string[]>;
  data?: string;
}

function tryDecode(m: Msg): Event | undefined {
  try {
    return decode(m.headers, m.data);
  } catch {
    return undefined;
  }
}

function tryDecodeStored(m: StoredMsg): Event | undefined {
  const h: MsgHdrs = natsHeaders();
  for (const [k, vs] of Object.entries(m.header ?? {})) for (const v of vs) h.append(k, v);
  try {
    return decode(h, Buffer.from(m.data ?? "", "base64"));
  } catch {
    return undefined;
  }
}
