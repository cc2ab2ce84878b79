// The executor side: actions registered with a handler, served to one pool
// with bounded slots, as docs/protocol.md's executor rules say. Each rule
// id (E-…) is named where it is implemented.
import { hostname } from "node:os";
import { createHash } from "node:crypto";
import type { NatsConnection, Msg } from "@nats-io/transport-node";
import { jetstream, type JetStreamClient, type JsMsg, type Consumer } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import { Ajv2020 } from "ajv/dist/2020.js";
import type { ValidateFunction } from "ajv";
import { ActionbusError, Codes } from "./errors.js";
import { decode, encode, Types, type Event } from "./cloudevents.js";
import { derivedId, newId, resultId, validRunId } from "./ids.js";
import { inputHash as hashInput } from "./canonical.js";
import { putArtifact, type ArtifactStore } from "./artifacts.js";
import { Idempotency, type IdemEntry } from "./idempotency.js";
import { argIssues, argIssuesOfZod, argsError, prepareArgs, schemaError, schemaIssues, withBlank, type ArgIssue, type ZodIssueLike } from "./validation.js";
import { rejection } from "./rejected.js";
import { tenantOr, type ActionRequested, type ApprovalGrant, type ArtifactRef, type Mode } from "./wire.js";

/** A zod schema, as far as the SDK uses one (zod 4). */
export interface ZodLike<T = unknown> {
  safeParse(v: unknown): { success: true; data: T } | { success: false; error: { issues: ZodIssueLike[] } };
}

/** ActionDefinition describes an action for {@link Executor.registerAction}. */
export interface ActionDefinition<I = unknown> {
  /** Unique per catalog: letters, digits, '.', '_', '-'. */
  name: string;
  /** A short planner-facing description. */
  description: string;
  /** Default "read". */
  mode?: Mode;
  /** Default policy tier, 0 (allow) to 3 (deny); default 0. */
  tier?: number;
  /** The input's JSON Schema (draft 2020-12); give this or `schema`. */
  inputSchema?: Record<string, unknown>;
  /** The input as a zod schema; its JSON Schema is announced (z.toJSONSchema). */
  schema?: ZodLike<I>;
  /** The output's JSON Schema; output is validated against it (E-OUTPUT). None: not checked. */
  outputSchema?: Record<string, unknown>;
  /** Bounds one execution; default the executor's defaultTimeoutMs. */
  timeoutMs?: number;
  /** Default "1". */
  version?: string;
  /** Input keys only the host may set: removed from input whose origin is not "host" before validation (E-INPUT). */
  hostOnlyKeys?: string[];
  /** An object property of the input that collects the arguments a model put beside it instead of inside it. */
  healFlattenedInto?: string;
}

/** Call is the invocation a handler serves. */
export interface Call {
  runId: string;
  callId: string;
  action: string;
  tenant: string;
  userId?: string;
  origin: string;
  attempt: number;
  /** The call's idempotency key ("" when none; always set for mutate actions). */
  idempotencyKey: string;
  /** SHA-256 of the input's RFC 8785 form. */
  inputHash: string;
  /** The verified approval of a call that needed one (mutate). */
  approval?: ApprovalGrant;
  /** Aborted at the call's timeout and when its run ends; honour it. */
  signal: AbortSignal;
  /** Stores data in the pool's artifact store and returns its reference. */
  putArtifact(role: string, mediaType: string, data: Uint8Array): Promise<ArtifactRef>;
}

/** Result is what a handler returns: complete ends the run with output. */
export interface Result<O = unknown> {
  output: O;
  summary?: string;
  complete?: boolean;
}

/** Handler serves one action. Throw an ActionbusError to choose the failure code; anything else is handler_failed. */
export type Handler<I = unknown, O = unknown> = (input: I, call: Call) => Promise<Result<O>> | Result<O>;

/** Logger receives the executor's logs; the default discards them. */
export interface Logger {
  info(msg: string, attrs?: Record<string, unknown>): void;
  warn(msg: string, attrs?: Record<string, unknown>): void;
}

const discard: Logger = { info() {}, warn() {} };

/** ExecutorConfig configures an {@link Executor}. */
export interface ExecutorConfig {
  /** The pool; default "default". Its consumer must exist (actionbus provision --pool NAME). */
  pool?: string;
  /** Concurrent handlers; default 8. Each free slot pulls one message (E-PULL). */
  slots?: number;
  /** Names this executor in results and presence; default <hostname>-<pid>-<random>. */
  id?: string;
  /** Subject prefix; default "ab". */
  prefix?: string;
  /** Timeout of an action without its own; default 30 000 ms. */
  defaultTimeoutMs?: number;
  /** Largest output carried in a result, bytes; default 256 KiB, never more than half the server's max payload (E-ARTIFACT). */
  maxOutputBytes?: number;
  /** Bound of an artifact's preview; default 1024 bytes. */
  previewBytes?: number;
  /** How long run() waits for a registrar to answer the announcement; default 60 000 ms. */
  announceTimeoutMs?: number;
  /** How long run() waits for running handlers after its signal aborts; default 10 000 ms. */
  shutdownGraceMs?: number;
  /** Dedicates the pool to these tenants (E-TENANT); empty serves every tenant. */
  tenants?: string[];
  logger?: Logger;
}

interface Registered {
  def: ActionDefinition;
  handler: Handler;
  validateInput?: ValidateFunction;
  validateOutput?: ValidateFunction;
  /** The input's JSON Schema (a zod schema's, once announced): what input preparation reads. */
  inputJSON?: Record<string, unknown>;
}

/** Delivery bound of the pool consumer (bus.DefaultMaxDeliver): at it, delivery_exhausted (E-REDELIVERY). */
export const MaxDeliver = 5;
/** How long a handler may take to return after its deadline before it counts as ignoring its signal. */
const returnGrace = 100;
/** How long an executor keeps trying to publish a result. */
const resultPatience = 30_000;
/** How long past its own timeout a call waits for another holder of its key. */
const heldKeyPatience = 30_000;
/** How long one pull request of an idle slot lives on the server. */
const pullWait = 5_000;

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });

/** RunEnded is the abort reason of a handler whose run ended. */
export class RunEndedError extends Error {
  constructor() { super("the run ended"); this.name = "RunEndedError"; }
}
class TimeoutReason extends Error {}
class ShutdownReason extends Error {}

/**
 * Executor serves registered actions to a pool. Register every action,
 * then call {@link Executor.run}. One instance serves one pool; run more
 * processes for more capacity (they share the pool's durable consumer).
 */
export class Executor {
  readonly id: string;
  readonly pool: string;
  private readonly nc: NatsConnection;
  private readonly js: JetStreamClient;
  private readonly cfg: Required<Omit<ExecutorConfig, "tenants" | "logger" | "id" | "pool">> & { tenants: string[] };
  private readonly log: Logger;
  private readonly actions = new Map<string, Registered>();
  private readonly ajv = new Ajv2020({ strict: false, allErrors: true, verbose: true });
  private readonly inflight = new Map<string, Map<string, AbortController>>();
  private readonly ended = new Set<string>();
  private heartbeatMs = 10_000;
  private idem?: Idempotency;
  private artifacts?: ArtifactStore;
  private readyResolve!: () => void;
  /** Resolves once the registrar recorded the actions and the slots pull work. */
  readonly ready: Promise<void>;

  constructor(nc: NatsConnection, cfg: ExecutorConfig = {}) {
    this.nc = nc;
    this.js = jetstream(nc);
    this.pool = cfg.pool || "default";
    this.id = cfg.id || `${hostname()}-${process.pid}-${newId().slice(20)}`;
    this.cfg = {
      slots: cfg.slots && cfg.slots > 0 ? cfg.slots : 8,
      prefix: cfg.prefix || "ab",
      defaultTimeoutMs: cfg.defaultTimeoutMs && cfg.defaultTimeoutMs > 0 ? cfg.defaultTimeoutMs : 30_000,
      maxOutputBytes: cfg.maxOutputBytes && cfg.maxOutputBytes > 0 ? cfg.maxOutputBytes : 256 << 10,
      previewBytes: cfg.previewBytes && cfg.previewBytes > 0 ? cfg.previewBytes : 1024,
      announceTimeoutMs: cfg.announceTimeoutMs && cfg.announceTimeoutMs > 0 ? cfg.announceTimeoutMs : 60_000,
      shutdownGraceMs: cfg.shutdownGraceMs && cfg.shutdownGraceMs > 0 ? cfg.shutdownGraceMs : 10_000,
      tenants: cfg.tenants ?? [],
    };
    this.log = cfg.logger ?? discard;
    this.ready = new Promise((r) => (this.readyResolve = r));
  }

  /**
   * registerAction adds an action. It throws an ActionbusError
   * (invalid_definition) for a name registered twice, a definition without
   * an input schema, or a schema that does not compile.
   */
  registerAction<I = any, O = any>(def: ActionDefinition<I>, handler: Handler<I, O>): void {
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(def.name)) throw new ActionbusError("invalid_definition", `invalid action name ${JSON.stringify(def.name)}`);
    if (this.actions.has(def.name)) throw new ActionbusError("invalid_definition", `action ${def.name} is already registered`);
    if (!def.inputSchema && !def.schema) throw new ActionbusError("invalid_definition", `action ${def.name} needs an inputSchema or a zod schema`);
    const reg: Registered = { def: def as ActionDefinition, handler: handler as Handler, inputJSON: def.inputSchema };
    try {
      if (def.inputSchema) reg.validateInput = this.ajv.compile(def.inputSchema);
      if (def.outputSchema) reg.validateOutput = this.ajv.compile(def.outputSchema);
    } catch (err) {
      throw new ActionbusError("invalid_definition", `action ${def.name}: ${(err as Error).message}`);
    }
    this.actions.set(def.name, reg);
  }

  private subject(...tokens: string[]): string {
    return [this.cfg.prefix, ...tokens].join(".");
  }

  /**
   * run announces the actions (E-ANNOUNCE), keeps the executor's presence
   * and serves the pool until signal aborts; then it stops pulling, waits up
   * to shutdownGraceMs for running handlers, aborts the rest and hands their
   * messages back (E-SHUTDOWN). A refused announcement rejects with the
   * registrar's ActionbusError (catalog_conflict, invalid_definition, …),
   * and one no registrar answers in time with registrar_unavailable.
   */
  async run(signal: AbortSignal): Promise<void> {
    const p = this.cfg.prefix.toLowerCase();
    const kvm = new Kvm(this.js);
    const presence = await kvm.open(`${p}_presence_${this.pool}`);
    this.idem = new Idempotency(await kvm.open(`${p}_idempotency_${this.pool}`), () => this.heartbeatMs, this.log);
    this.artifacts = { name: `${p}_artifacts_${this.pool}`, os: await new Objm(this.js).open(`${p}_artifacts_${this.pool}`) };
    await this.announce(signal);
    const consumer = await this.js.consumers.get(`${this.cfg.prefix.toUpperCase()}_WORK`, `pool-${this.pool}`);
    const info = await consumer.info(true);
    const ackWaitMs = info.config.ack_wait ? info.config.ack_wait / 1e6 : 30_000;
    this.heartbeatMs = Math.max(50, Math.floor(ackWaitMs / 3));

    // E-CANCEL: a run that ends stops its calls; its queued calls are not run.
    // The dispatcher tells the pool, with the run id only.
    const subs = [this.nc.subscribe(this.subject("pool", this.pool, "ended"), { callback: (_e, m) => this.onRunEnded(m) })];
    await this.nc.flush();

    const presenceKey = `${this.pool}.${this.id}`;
    const presenceVal = JSON.stringify({ id: this.id, pool: this.pool, slots: this.cfg.slots, startedAt: new Date().toISOString() });
    const present = async () => { try { await presence.put(presenceKey, presenceVal); } catch (err) { this.log.warn("presence not refreshed", { err: String(err) }); } };
    await present();
    const presenceTimer = setInterval(present, 5_000);

    const shutdown = new AbortController(); // aborts handlers past the grace
    this.log.info("executor serving", { actions: this.actions.size, slots: this.cfg.slots, pool: this.pool });
    this.readyResolve();
    const slots = Array.from({ length: this.cfg.slots }, () => this.slot(consumer, signal, shutdown.signal));
    await new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener("abort", () => r(), { once: true })));
    const drained = Promise.all(slots);
    const grace = setTimeout(() => {
      this.log.warn("shutdown grace over; aborting running handlers and handing their work back");
      shutdown.abort(new ShutdownReason("shutting down"));
    }, this.cfg.shutdownGraceMs);
    await drained;
    clearTimeout(grace);
    clearInterval(presenceTimer);
    for (const s of subs) s.unsubscribe();
    try { await presence.delete(presenceKey); } catch { /* best effort */ }
  }

  // E-PULL: a slot asks for one message only when it is free.
  private async slot(consumer: Consumer, stop: AbortSignal, shutdown: AbortSignal): Promise<void> {
    while (!stop.aborted) {
      let m: JsMsg | null;
      try {
        m = await consumer.next({ expires: pullWait });
      } catch (err) {
        this.log.warn("pull failed", { err: String(err) });
        await sleep(200, stop);
        continue;
      }
      if (!m) continue;
      if (stop.aborted) {
        m.nak(); // E-SHUTDOWN: taken after the stop: hand it back at once
        return;
      }
      await this.handle(m, shutdown);
    }
  }

  private onRunEnded(m: Msg): void {
    const runId = m.string();
    if (!validRunId(runId)) return;
    if (this.ended.size >= 8192) this.ended.delete(this.ended.values().next().value as string);
    this.ended.add(runId);
    const calls = this.inflight.get(runId);
    this.inflight.delete(runId);
    for (const c of calls?.values() ?? []) c.abort(new RunEndedError());
  }

  private async handle(m: JsMsg, shutdown: AbortSignal): Promise<void> {
    let ev: Event;
    try {
      ev = decode(m.headers, m.data);
      if (ev.type !== Types.ActionRequested) throw new ActionbusError(Codes.UnknownEventType, `${ev.type} does not belong on a work subject`);
      const d = ev.data as ActionRequested;
      if (!d || typeof d.callId !== "string" || typeof d.action !== "string" || typeof d.runId !== "string") {
        throw new ActionbusError(Codes.MalformedEvent, "an action.requested needs runId, callId and action");
      }
    } catch (err) {
      await this.reject(m, err); // E-REJECT
      return;
    }
    const req = ev.data as ActionRequested;
    const deliveries = m.info.deliveryCount; // E-REDELIVERY: deliveries is JetStream's count
    const out = await this.execute(m, ev, req, deliveries, shutdown);
    // E-ACK: one place decides the ack, after the result is stored.
    switch (out.kind) {
      case "result": m.ack(); break;
      case "handBack": m.nak(); break;
      case "retryLater": m.nak(out.delayMs); break;
      case "publishFailed": m.nak(1000); break;
    }
  }

  // E-REJECT: an undecodable message becomes event.rejected, and is acked.
  private async reject(m: JsMsg, err: unknown): Promise<void> {
    const reason = err instanceof ActionbusError ? { code: err.code, message: err.message } : { code: Codes.EventRejected, message: String(err) };
    const hdrs: Record<string, string[]> = {};
    for (const k of m.headers?.keys() ?? []) hdrs[k] = m.headers!.values(k);
    const stream = m.info.stream || "unknown";
    const data = rejection({ reason, subject: m.subject, headers: hdrs, data: m.data, consumer: `pool-${this.pool}`, stream,
      streamSequence: m.info.streamSequence, maxPayload: this.nc.info?.max_payload ?? 0 });
    const { headers, body } = encode({ id: newId(), type: Types.EventRejected, source: `/actionbus/executor/${this.pool}`, data });
    try {
      await this.js.publish(this.subject("rejected", stream), body, { headers });
      this.log.warn("event rejected", { subject: m.subject, code: reason.code });
      m.ack();
    } catch (perr) {
      this.log.warn("rejection not stored", { err: String(perr) });
      m.nak(1000);
    }
  }

  private async execute(m: JsMsg, ev: Event, req: ActionRequested, deliveries: number, shutdown: AbortSignal): Promise<Outcome> {
    const publish = (res: Result | undefined, err: ActionbusError | undefined, tookMs: number, replayed = false) =>
      this.publishResult(m, ev, req, res, err, tookMs, deliveries, replayed);
    const fail = (code: string, message: string, details?: Record<string, unknown>) => publish(undefined, new ActionbusError(code, message, details), 0);

    if (deliveries >= MaxDeliver) { // E-REDELIVERY
      return fail(Codes.DeliveryExhausted, `delivered ${deliveries} times without a result; not running it again`);
    }
    if (this.ended.has(req.runId)) { // E-CANCEL
      return fail(Codes.RunEnded, `run ${req.runId} ended before this call started; the handler was not called`);
    }
    const reg = this.actions.get(req.action);
    if (!reg) { // E-UNKNOWN-ACTION
      return fail(Codes.ActionNotFound, `action ${JSON.stringify(req.action)} is not registered on pool ${this.pool}`);
    }
    const tenant = tenantOr(req.tenant);
    if (this.cfg.tenants.length > 0 && !this.cfg.tenants.includes(tenant)) { // E-TENANT
      return fail(Codes.TenantNotServed, `pool ${this.pool} is dedicated to other tenants than ${tenant}`);
    }
    // E-INPUT: prepared as the Go executor prepares it, then validated; the hash is the prepared input's.
    const prepared = prepareArgs(req.action, reg.inputJSON, reg.def, req.args, req.origin);
    const checked = this.checkInput(reg, req.action, prepared.input);
    const issues = withBlank(prepared.blank, checked.ok ? [] : checked.issues);
    if (issues.length > 0) return publish(undefined, argsError(req.action, issues), 0);
    const input = checked.ok ? checked.value : prepared.input;
    const hash = hashInput(prepared.input);
    // E-APPROVAL: a mutation runs only with an approval bound to its input.
    const mode = reg.def.mode ?? "read";
    if (mode === "mutate") {
      if (!req.approval) return fail(Codes.ApprovalRequired, `mutate action ${req.action} arrived without an approval`);
      if (req.approval.context.inputHash !== hash || req.approval.context.action !== req.action) {
        return fail(Codes.ApprovalInvalid, `the approval of ${req.action} is bound to other input`);
      }
    }
    // E-TIMEOUT: the action's own timeout, shortened by the request's.
    let timeoutMs = reg.def.timeoutMs && reg.def.timeoutMs > 0 ? reg.def.timeoutMs : this.cfg.defaultTimeoutMs;
    if (req.timeoutMs && req.timeoutMs > 0 && req.timeoutMs < timeoutMs) timeoutMs = req.timeoutMs;

    // E-IDEMPOTENCY
    const key = req.idempotencyKey || (mode === "mutate" ? req.callId : "");
    let claim: Awaited<ReturnType<Idempotency["reserve"]>> | undefined;
    if (key) {
      const entry: IdemEntry = { state: "reserved", callId: req.callId, executor: this.id, reservedAt: new Date().toISOString(), timeoutMs,
        action: req.action, tenant, userId: req.userId || undefined, inputHash: hash };
      const giveUp = Date.now() + timeoutMs + heldKeyPatience;
      for (;;) {
        try {
          claim = await this.idem!.reserve(`${this.pool}.${tenant}.${createHash("sha256").update(key, "utf8").digest("hex")}`, entry);
        } catch (err) {
          if (err instanceof ActionbusError) return publish(undefined, err, 0);
          this.log.warn("idempotency key not reserved", { err: String(err), callId: req.callId });
          return { kind: "publishFailed" };
        }
        if (claim.kind === "stored") {
          const s = claim.entry;
          return publish({ output: s.output, summary: s.summary, complete: s.complete }, undefined, 0, true);
        }
        if (claim.kind === "claimed") break;
        if (Date.now() + claim.waitMs > giveUp) return { kind: "retryLater", delayMs: claim.waitMs };
        m.working(); // wait for the holder in the slot, spending no delivery
        await sleep(Math.min(claim.waitMs, this.heartbeatMs), shutdown);
        if (shutdown.aborted) return { kind: "handBack" };
      }
    }
    const held = claim?.kind === "claimed" ? claim : undefined;

    // E-HEARTBEAT, E-TIMEOUT, E-CANCEL: the handler runs under one signal.
    const ctl = new AbortController();
    const onShutdown = () => ctl.abort(shutdown.reason);
    shutdown.addEventListener("abort", onShutdown, { once: true });
    const calls = this.inflight.get(req.runId) ?? new Map<string, AbortController>();
    calls.set(req.callId, ctl);
    this.inflight.set(req.runId, calls);
    const timer = setTimeout(() => ctl.abort(new TimeoutReason("timeout")), timeoutMs);
    const beat = setInterval(() => m.working(), this.heartbeatMs);
    const call: Call = {
      runId: req.runId, callId: req.callId, action: req.action, tenant, userId: req.userId, origin: req.origin, attempt: req.attempt,
      idempotencyKey: key, inputHash: hash, approval: req.approval, signal: ctl.signal,
      putArtifact: (role, mediaType, data) => putArtifact(this.artifacts!, { tenant, runId: req.runId },
        derivedId(req.callId, "artifact", role, req.attempt), role, mediaType, data, this.cfg.previewBytes),
    };
    const start = Date.now();
    let deadlineAt = 0; // when the call's deadline aborted its signal
    const running = (async () => reg.handler(input, call))();
    running.catch(() => {}); // observed below
    let res: Result | undefined;
    let err: ActionbusError | undefined;
    let abandoned = false;
    let took = 0;
    try {
      const deadline = new Promise<"deadline">((resolve) =>
        ctl.signal.addEventListener("abort", () => {
          if (!(ctl.signal.reason instanceof TimeoutReason)) return; // canceled: wait for the handler
          deadlineAt = Date.now();
          setTimeout(() => resolve("deadline"), returnGrace);
        }, { once: true }));
      const first = await Promise.race([running.then((r) => ({ r }), (e: unknown) => ({ e })), deadline]);
      // E-RESULT: durationMs is the handler's own running time, to its deadline on a timeout.
      took = (ctl.signal.reason instanceof TimeoutReason && deadlineAt > 0 ? deadlineAt : Date.now()) - start;
      const reason = ctl.signal.reason;
      if (first === "deadline") {
        abandoned = true;
        this.log.warn("handler ignored its signal; reporting a timeout and discarding its late output", { action: req.action, callId: req.callId });
        err = timeoutError(req.action, timeoutMs, true);
      } else if (reason instanceof ShutdownReason) {
        return { kind: "handBack" };
      } else if (reason instanceof RunEndedError) {
        err = new ActionbusError(Codes.Canceled, `action ${req.action} was canceled: its run ended`);
      } else if (reason instanceof TimeoutReason) {
        err = timeoutError(req.action, timeoutMs, false);
      } else if ("e" in first) {
        err = first.e instanceof ActionbusError ? first.e : new ActionbusError(Codes.HandlerFailed, first.e instanceof Error ? first.e.message : String(first.e));
      } else {
        res = normalizeResult(first.r);
        err = this.checkOutput(reg, res); // E-OUTPUT
      }
    } finally {
      clearTimeout(timer);
      clearInterval(beat);
      shutdown.removeEventListener("abort", onShutdown);
      calls.delete(req.callId);
      if (calls.size === 0 && this.inflight.get(req.runId) === calls) this.inflight.delete(req.runId);
    }
    if (held) {
      if (!err && res) {
        try { await held.complete(res); } catch (cerr) { this.log.warn("result not stored under its idempotency key", { err: String(cerr) }); }
      } else if (abandoned) {
        // the key stays reserved (leased) until the handler really returns
        void running.then(() => held.release(), () => held.release());
      } else {
        await held.release();
      }
    }
    const outcome = await publish(res, err, took);
    if (abandoned) await running.then(() => {}, () => {}); // the slot is free when the handler returns
    return outcome;
  }

  private checkInput(reg: Registered, action: string, args: Record<string, unknown>): { ok: true; value: unknown } | { ok: false; issues: ArgIssue[] } {
    if (reg.def.schema) {
      const r = reg.def.schema.safeParse(args);
      if (r.success) return { ok: true, value: r.data };
      return { ok: false, issues: argIssuesOfZod(action, args, r.error.issues) };
    }
    if (reg.validateInput && !reg.validateInput(args)) {
      return { ok: false, issues: argIssues(action, schemaIssues(reg.validateInput.errors)) };
    }
    return { ok: true, value: args };
  }

  // E-OUTPUT: schema_validation with details.issues {path, keyword, reason}, sorted by path.
  private checkOutput(reg: Registered, res: Result): ActionbusError | undefined {
    if (reg.validateOutput && !reg.validateOutput(res.output ?? null)) return schemaError(schemaIssues(reg.validateOutput.errors));
    return undefined;
  }

  private outputLimit(): number {
    const mp = this.nc.info?.max_payload ?? 0;
    return mp > 0 ? Math.min(this.cfg.maxOutputBytes, Math.floor(mp / 2)) : this.cfg.maxOutputBytes;
  }

  // E-RESULT, E-RESULT-ID, E-ARTIFACT: the result event, published patiently.
  private async publishResult(m: JsMsg, ev: Event, req: ActionRequested, res: Result | undefined, err: ActionbusError | undefined,
    tookMs: number, deliveries: number, replayed: boolean): Promise<Outcome> {
    const tenant = tenantOr(req.tenant);
    const common = { runId: req.runId, callId: req.callId, cycle: req.cycle, planIndex: req.planIndex, attempt: req.attempt, action: req.action,
      durationMs: tookMs, executor: this.id, deliveries, userId: req.userId || undefined, stepId: req.stepId || undefined,
      maxAttempts: req.maxAttempts || undefined };
    let type: string;
    let data: Record<string, unknown>;
    if (err) {
      type = Types.ActionFailed;
      data = { ...common, error: err.toJSON() };
    } else {
      type = Types.ActionCompleted;
      data = { ...common, output: res?.output, summary: res?.summary || undefined, complete: res?.complete || undefined, replayed: replayed || undefined };
      const out = res?.output as Record<string, unknown> | undefined;
      const isRef = out && typeof out === "object" && !Array.isArray(out) && out.artifact != null;
      const encoded = Buffer.byteLength(JSON.stringify(res?.output ?? null), "utf8");
      if (!isRef && encoded > this.outputLimit()) {
        try {
          const ref = await putArtifact(this.artifacts!, { tenant, runId: req.runId }, derivedId(req.callId, "artifact", "output"), "output",
            "application/json", Buffer.from(JSON.stringify(res?.output ?? null), "utf8"), this.cfg.previewBytes);
          data.artifacts = [ref];
          data.output = { artifact: ref };
        } catch (aerr) {
          this.log.warn("output not stored as an artifact; the request will be redelivered", { err: String(aerr) });
          return { kind: "publishFailed" };
        }
      }
    }
    const ext: Record<string, string | number | undefined> = { runid: req.runId, tenant, cycle: req.cycle, planindex: req.planIndex, attempt: req.attempt,
      traceparent: ev.extensions.traceparent, tracestate: ev.extensions.tracestate };
    const id = resultId(req.callId, req.attempt);
    let msg = encode({ id, type, source: `/actionbus/executor/${this.pool}`, extensions: ext, data });
    const mp = this.nc.info?.max_payload ?? 0;
    if (mp > 0 && msg.body.length + 4096 > mp) {
      const tooLarge = new ActionbusError(Codes.PayloadTooLarge, `the result of ${req.action} is too large: ${msg.body.length} bytes`);
      msg = encode({ id, type: Types.ActionFailed, source: `/actionbus/executor/${this.pool}`, extensions: ext, data: { ...common, error: tooLarge.toJSON() } });
    }
    const subject = this.subject("run", tenant, req.runId, "result");
    const giveUp = Date.now() + resultPatience;
    for (let wait = 100; ; wait = Math.min(2 * wait, 2000)) {
      try {
        await this.js.publish(subject, msg.body, { headers: msg.headers });
        return { kind: "result" };
      } catch (perr) {
        if (Date.now() > giveUp) {
          this.log.warn("result not published; the request will be redelivered", { err: String(perr), callId: req.callId });
          return { kind: "publishFailed" };
        }
        m.working();
        await sleep(wait);
      }
    }
  }

  // E-ANNOUNCE: the actions go to the registrar before any pull; a refusal stops the executor.
  private async announce(signal: AbortSignal): Promise<void> {
    const actions = [];
    for (const reg of this.actions.values()) {
      const d = reg.def;
      let inputSchema = d.inputSchema;
      if (!inputSchema && d.schema) {
        const zod = await import("zod");
        inputSchema = zod.toJSONSchema(d.schema as never, { io: "input" }) as Record<string, unknown>;
        reg.inputJSON = inputSchema;
      }
      actions.push({ name: d.name, description: d.description, mode: d.mode ?? "read", tier: d.tier ?? 0, inputSchema,
        outputSchema: d.outputSchema, version: d.version ?? "1", timeoutMs: d.timeoutMs, pool: this.pool,
        hostOnlyKeys: d.hostOnlyKeys && d.hostOnlyKeys.length > 0 ? d.hostOnlyKeys : undefined,
        healFlattenedInto: d.healFlattenedInto || undefined,
        tenants: this.cfg.tenants.length > 0 ? this.cfg.tenants : undefined });
    }
    const subject = this.subject("pool", this.pool, "announce");
    const { headers, body } = encode({ id: newId(), type: Types.PoolAnnounced, source: `/actionbus/executor/${this.pool}`,
      extensions: { pool: this.pool }, data: { executor: this.id, pool: this.pool, actions } });
    const deadline = Date.now() + this.cfg.announceTimeoutMs;
    let last: unknown;
    for (let wait = 100; ; wait = Math.min(2 * wait, 2000)) {
      try {
        const reply = await this.nc.request(subject, body, { timeout: Math.min(5000, Math.max(1, deadline - Date.now())), headers });
        const r = JSON.parse(Buffer.from(reply.data).toString("utf8")) as { error?: unknown };
        if (!r.error) return;
        const e = ActionbusError.from(r.error);
        if (e.code !== Codes.RegistrarUnavailable) throw e;
        last = e;
      } catch (err) {
        if (err instanceof ActionbusError && err.code !== Codes.RegistrarUnavailable) throw err;
        last = err;
      }
      if (Date.now() + wait > deadline || signal.aborted) {
        throw new ActionbusError(Codes.RegistrarUnavailable,
          `no registrar (dispatcher) answered the announcement of pool ${this.pool} on ${subject} before the deadline (${String(last)})`, { pool: this.pool });
      }
      this.log.info("no registrar answered the announcement yet; retrying", { err: String(last), wait });
      await sleep(wait, signal);
    }
  }
}

type Outcome = { kind: "result" } | { kind: "handBack" } | { kind: "retryLater"; delayMs: number } | { kind: "publishFailed" };

function normalizeResult(r: unknown): Result {
  if (r && typeof r === "object" && "output" in (r as Record<string, unknown>)) return r as Result;
  return { output: r };
}

function timeoutError(action: string, timeoutMs: number, ignoredSignal: boolean): ActionbusError {
  return new ActionbusError(Codes.Timeout, `action ${action} exceeded its ${timeoutMs}ms timeout${ignoredSignal ? " (the handler ignored its signal)" : ""}`,
    { timeoutMs, ignoredContext: ignoredSignal });
}
