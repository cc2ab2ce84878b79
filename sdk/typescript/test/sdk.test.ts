// The SDK against the real services: test/process/typescript_test.go
// starts an embedded NATS server and the dispatcher, planner and auditor
// (actionbustest), provisions the pool ACTIONBUS_POOL, and runs `npm test`
// with ACTIONBUS_NATS_URL, ACTIONBUS_POOL, ACTIONBUS_APPROVAL_KEY
// ("kid:base64secret") and ACTIONBUS_RESULT_IDS (Go's events.ResultID of
// fixed inputs). The executor under test runs in this process.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { Kvm } from "@nats-io/kv";
import { z } from "zod";
import {
  ActionbusError, Client, Executor, MaxDeliver, RunEndedError, Types, decode, encode, newId, resultId, derivedId, inputHash, signApproval,
  type Event,
} from "../src/index.js";

const url = process.env.ACTIONBUS_NATS_URL;
const pool = process.env.ACTIONBUS_POOL ?? "tsdk";
const [keyId, keySecret] = (process.env.ACTIONBUS_APPROVAL_KEY ?? ":").split(":");
const key = Buffer.from(keySecret, "base64");

let nc: NatsConnection;
let ex: Executor;
let client: Client;
const stop = new AbortController();
let served: Promise<void>;

// What the handlers saw, for the tests to check.
const counters = new Map<string, number>();
const calls = new Map<string, number>();
const blocked: { started?: () => void; reason?: unknown } = {};
let blockStarted = new Promise<void>((r) => (blocked.started = r));
let blockEnded!: (reason: unknown) => void;
let blockAborted = new Promise<unknown>((r) => (blockEnded = r));

const count = (name: string) => calls.set(name, (calls.get(name) ?? 0) + 1);

before(async () => {
  assert.ok(url, "ACTIONBUS_NATS_URL is not set: run these tests through test/process (TestTheTypeScriptSDKAgainstTheServices)");
  nc = await connect({ servers: url, name: "sdk-test" });
  ex = new Executor(nc, { pool, slots: 4 });
  ex.registerAction({
    name: "ts.echo", description: "Returns its text.",
    inputSchema: { type: "object", properties: { text: { type: "string", maxLength: 1000 } }, required: ["text"], additionalProperties: false },
    outputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  }, (input: { text: string }) => { count("ts.echo"); return { output: { text: input.text }, summary: "echoed" }; });
  ex.registerAction({
    name: "ts.sleep", description: "Waits ms.", timeoutMs: 1000,
    inputSchema: { type: "object", properties: { ms: { type: "integer", minimum: 0, maximum: 60000 } }, required: ["ms"] },
  }, async (input: { ms: number }, call) => {
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(resolve, input.ms);
      call.signal.addEventListener("abort", () => { clearTimeout(t); reject(call.signal.reason); }, { once: true });
    });
    return { output: { slept: input.ms } };
  });
  ex.registerAction({
    name: "ts.slow", description: "Waits ms, longer than the ack wait.", timeoutMs: 20_000,
    inputSchema: { type: "object", properties: { ms: { type: "integer" } }, required: ["ms"] },
  }, async (input: { ms: number }, call) => {
    count("ts.slow");
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(resolve, input.ms);
      call.signal.addEventListener("abort", () => { clearTimeout(t); reject(call.signal.reason); }, { once: true });
    });
    return { output: { slept: input.ms } };
  });
  ex.registerAction({
    name: "ts.block", description: "Waits until its call is aborted.", timeoutMs: 60_000,
    inputSchema: { type: "object", properties: {} },
  }, async (_input, call) => {
    count("ts.block");
    blocked.started?.();
    const reason = await new Promise((r) => call.signal.addEventListener("abort", () => r(call.signal.reason), { once: true }));
    blockEnded(reason);
    throw reason;
  });
  ex.registerAction({
    name: "ts.big", description: "Returns bytes 'x'.",
    inputSchema: { type: "object", properties: { bytes: { type: "integer", minimum: 1 } }, required: ["bytes"] },
  }, (input: { bytes: number }) => ({ output: { data: "x".repeat(input.bytes) } }));
  ex.registerAction({
    name: "ts.increment", mode: "mutate", description: "Increments the counter of key.",
    inputSchema: { type: "object", properties: { key: { type: "string" } }, required: ["key"], additionalProperties: false },
  }, (input: { key: string }) => {
    const n = (counters.get(input.key) ?? 0) + 1;
    counters.set(input.key, n);
    return { output: { count: n } };
  });
  ex.registerAction({
    name: "ts.zod", description: "Greets a name (a zod schema).",
    schema: z.object({ name: z.string().min(2) }),
  }, (input: { name: string }) => ({ output: { greeting: `hello ${input.name}` } }));
  ex.registerAction({
    name: "ts.stubborn", description: "Ignores its signal: runs 600 ms under a 300 ms timeout.", timeoutMs: 300,
    inputSchema: { type: "object", properties: {} },
  }, async () => {
    await new Promise((r) => setTimeout(r, 600));
    return { output: { late: true } };
  });
  ex.registerAction({
    name: "ts.shape", description: "Returns the object output of its input, checked by its output schema.",
    inputSchema: { type: "object", properties: { output: { type: "object" } }, required: ["output"], additionalProperties: false },
    outputSchema: { type: "object", properties: { count: { type: "integer" }, name: { type: "string" } }, required: ["count", "name"] },
  }, (input: { output: Record<string, unknown> }) => ({ output: input.output }));
  served = ex.run(stop.signal);
  served.catch(() => {});
  await Promise.race([ex.ready, served.then(() => { throw new Error("the executor stopped before it was ready"); })]);
  client = new Client(nc);
});

after(async () => {
  stop.abort();
  await served;
  await nc.drain();
});

/** dispatch publishes an action.requested on the pool's work subject, as the dispatcher does, and returns the result event. */
async function dispatch(action: string, args: Record<string, unknown>, extra: Record<string, unknown> = {}, runId = newId()): Promise<Event> {
  return (await request(pool, action, args, extra, runId)).result;
}

/** request publishes an action.requested on p's work subject; result resolves with the first result of its run. */
async function request(p: string, action: string, args: Record<string, unknown>, extra: Record<string, unknown> = {}, runId = newId()):
  Promise<{ callId: string; result: Promise<Event> }> {
  const callId = newId();
  const sub = nc.subscribe(`ab.run.default.${runId}.result`, { max: 1 });
  await nc.flush();
  const data = { runId, tenant: "default", callId, cycle: 1, planIndex: 0, attempt: 1, action, args, origin: "host", ...extra };
  const { headers, body } = encode({ id: derivedId(callId, "request"), type: Types.ActionRequested, source: "/actionbus/dispatcher",
    extensions: { runid: runId, tenant: "default", pool: p }, data });
  await jetstream(nc).publish(`ab.pool.${p}.request`, body, { headers });
  const result = (async () => {
    const timer = setTimeout(() => sub.unsubscribe(), 20_000);
    for await (const m of sub) {
      clearTimeout(timer);
      return decode(m.headers, m.data);
    }
    throw new Error(`no result for ${action} within 20 s`);
  })();
  result.catch(() => {});
  return { callId, result };
}

/** events collects a run's events until its end. */
async function collect(events: AsyncIterable<Event>, ms = 30_000): Promise<Event[]> {
  const out: Event[] = [];
  const done = (async () => { for await (const ev of events) out.push(ev); })();
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<void>((r) => (timer = setTimeout(r, ms)));
  await Promise.race([done, late]);
  clearTimeout(timer);
  const last = out.at(-1)?.type ?? "";
  assert.ok(/run\.(completed|failed|canceled)$/.test(last), `the run did not end within ${ms} ms; its events: ${JSON.stringify(out.map((e) => [e.type, e.data]))}`);
  return out;
}

/** approveWhenAsked approves the run's approval requests as they come, returning the run's events. */
async function approveWhenAsked(events: AsyncIterable<Event>): Promise<Event[]> {
  const out: Event[] = [];
  for await (const ev of events) {
    out.push(ev);
    if (ev.type === Types.ApprovalRequested) {
      const ctx = (ev.data as { context: { approvalId: string } }).context;
      await client.approve(ctx.approvalId, keyId, key);
    }
  }
  return out;
}

/** eventually polls cond every 20 ms until it holds, failing with what after 10 s. */
async function eventually(cond: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!(await cond())) {
    assert.ok(Date.now() < deadline, `not within 10 s: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const resultOf = (evs: Event[]) => evs.find((e) => e.type === Types.ActionCompleted || e.type === Types.ActionFailed);

test("result ids are Go's events.ResultID for the same inputs (E-RESULT-ID)", () => {
  assert.equal(resultId("01JD0000000000000000000000", 1), "01JD000000R0KQE2F5EV3JFSJ1"); // docs/events.md's example
  const vectors = JSON.parse(process.env.ACTIONBUS_RESULT_IDS ?? "[]") as { callId: string; attempt: number; id: string }[];
  assert.ok(vectors.length >= 3, "the Go test passes its vectors");
  for (const v of vectors) assert.equal(resultId(v.callId, v.attempt), v.id, `ResultID(${v.callId}, ${v.attempt})`);
});

test("an input hash is Go's policy.InputHash (RFC 8785, SHA-256)", () => {
  const want = process.env.ACTIONBUS_INPUT_HASH;
  assert.ok(want, "the Go test passes the hash of its fixed input");
  assert.equal(inputHash({ z: [1, 2.5, "é"], a: { y: true, b: null }, n: 1e21 }), want);
});

test("a TypeScript action is served end to end: run → result", async () => {
  const run = await client.run({ action: { name: "ts.echo", args: { text: "hello from ts" } } });
  const evs = await collect(run.events);
  const res = resultOf(evs)!;
  assert.equal(res.type, Types.ActionCompleted);
  const d = res.data as { output: unknown; callId: string; attempt: number; executor: string; deliveries: number };
  assert.deepEqual(d.output, { text: "hello from ts" });
  assert.equal(d.executor, ex.id);
  assert.equal(d.deliveries, 1);
  assert.equal(res.id, resultId(d.callId, d.attempt), "the result's id is derived from callId and attempt");
  assert.equal(res.extensions.runid, run.runId);
  assert.equal(res.extensions.tenant, "default");
  assert.equal(res.source, `/actionbus/executor/${pool}`);
  assert.equal(evs.at(-1)!.type, Types.RunCompleted);
  // C-AUDIT: the call's outcome is in the run's audit trail.
  await eventually(async () => (await client.auditRecords(run.runId)).some((r) => r.action === "ts.echo" && r.status === "succeeded"),
    "the audit trail records ts.echo succeeded");
});

test("a handler that runs past the ack wait is kept in progress, delivered once (E-HEARTBEAT)", async () => {
  const before = calls.get("ts.slow") ?? 0;
  const res = await dispatch("ts.slow", { ms: 4_000 }); // the consumers' ack wait is 2 s
  assert.equal(res.type, Types.ActionCompleted, JSON.stringify(res.data));
  assert.equal((res.data as { deliveries: number }).deliveries, 1);
  assert.equal((calls.get("ts.slow") ?? 0) - before, 1, "the handler ran once");
  const info = await (await jetstream(nc).consumers.get("AB_WORK", `pool-${pool}`)).info();
  assert.equal(info.config.ack_wait, 2_000_000_000, "the test runs with a 2 s ack wait");
});

test("a zod schema is announced as JSON Schema and validates the input", async () => {
  const ok = await dispatch("ts.zod", { name: "Ada" });
  assert.deepEqual((ok.data as { output: unknown }).output, { greeting: "hello Ada" });
  const bad = await dispatch("ts.zod", { name: "A" });
  assert.equal(bad.type, Types.ActionFailed);
  assert.equal((bad.data as { error: { code: string } }).error.code, "action_args_invalid");
});

test("schema-invalid input fails action_args_invalid without calling the handler (E-INPUT)", async () => {
  const before = calls.get("ts.echo") ?? 0;
  const res = await dispatch("ts.echo", { text: 5, extra: true });
  assert.equal(res.type, Types.ActionFailed);
  const err = (res.data as { error: { code: string; details: { actionName: string; issues: unknown[] } } }).error;
  assert.equal(err.code, "action_args_invalid");
  assert.equal(err.details.actionName, "ts.echo");
  assert.ok(err.details.issues.length >= 1);
  assert.equal(calls.get("ts.echo") ?? 0, before, "the handler was not called");
});

test("the executor's input issues: a missing property at its key, reason missing; a type mismatch, reason type (E-INPUT)", async () => {
  const missing = (await dispatch("ts.echo", {})).data as { error: { code: string; details: Record<string, unknown> } };
  assert.equal(missing.error.code, "action_args_invalid");
  const issue = { actionName: "ts.echo", key: "/text", reason: "missing", error: "missing required property" };
  assert.deepEqual(missing.error.details, { ...issue, issues: [issue] });
  const typed = (await dispatch("ts.echo", { text: 918273645 })).data as { error: { message: string; details: Record<string, unknown> } };
  assert.equal(typed.error.details.reason, "type");
  assert.equal(typed.error.details.key, "/text");
  assert.ok(!JSON.stringify(typed.error).includes("918273645"), "the rule is worded, not the value");
  const blank = (await dispatch("ts.echo", { text: "   " })).data as { error: { details: Record<string, unknown> } };
  assert.equal(blank.error.details.reason, "missing", "a blank required string is missing, as for Go");
});

test("input a model wrote loses its undeclared keys before validation; the host's does not (E-INPUT)", async () => {
  const model = await dispatch("ts.echo", { text: "hi", extra: true }, { origin: "model" });
  assert.equal(model.type, Types.ActionCompleted, JSON.stringify(model.data));
  assert.deepEqual((model.data as { output: unknown }).output, { text: "hi" });
  const host = await dispatch("ts.echo", { text: "hi", extra: true });
  assert.equal((host.data as { error: { details: { reason: string } } }).error.details.reason, "additionalProperties");
});

test("an output failing its schema fails schema_validation with details.issues sorted by path (E-OUTPUT)", async () => {
  const ok = await dispatch("ts.shape", { output: { count: 1, name: "fits" } });
  assert.equal(ok.type, Types.ActionCompleted);
  const bad = await dispatch("ts.shape", { output: { name: 918273645 } });
  assert.equal(bad.type, Types.ActionFailed);
  const err = (bad.data as { error: { code: string; message: string; details: unknown } }).error;
  assert.equal(err.code, "schema_validation");
  assert.deepEqual(err.details, { issues: [
    { path: "/count", keyword: "required", reason: "missing required property" },
    { path: "/name", keyword: "type", reason: "must be of type string, got number" },
  ] });
  assert.equal(err.message, "/count: missing required property; /name: must be of type string, got number");
});

test("durationMs of a handler that ignores its deadline stops at the deadline, without the grace (E-RESULT)", async () => {
  const res = await dispatch("ts.stubborn", {});
  const d = res.data as { error: { code: string; details: { ignoredContext: boolean } }; durationMs: number };
  assert.equal(d.error.code, "timeout");
  assert.equal(d.error.details.ignoredContext, true);
  assert.ok(d.durationMs >= 295 && d.durationMs < 400, `durationMs ${d.durationMs}: the 300 ms to the deadline, not the 100 ms grace after it`);
});

test("work naming an action this executor does not host fails action_not_found (E-UNKNOWN-ACTION)", async () => {
  const res = await dispatch("ts.nothing", {});
  assert.equal(res.type, Types.ActionFailed);
  assert.equal((res.data as { error: { code: string } }).error.code, "action_not_found");
});

test("a call over its timeout fails timeout with details.timeoutMs (E-TIMEOUT)", async () => {
  const run = await client.run({ action: { name: "ts.sleep", args: { ms: 10_000 } } });
  const started = Date.now();
  const evs = await collect(run.events);
  const res = resultOf(evs)!;
  assert.equal(res.type, Types.ActionFailed);
  const err = (res.data as { error: { code: string; details: { timeoutMs: number } } }).error;
  assert.equal(err.code, "timeout");
  assert.equal(err.details.timeoutMs, 1000);
  assert.ok(Date.now() - started < 8_000, "the call ended at its timeout, not after its sleep");
  assert.equal(evs.at(-1)!.type, Types.RunFailed);
  await assert.rejects(run.result(), (e: unknown) => e instanceof ActionbusError);
});

test("canceling a run mid-call aborts the handler's signal, and its queued work is run_ended (E-CANCEL)", async () => {
  const run = await client.run({ action: { name: "ts.block", args: {} } });
  await blockStarted;
  await client.cancel(run.runId, "test cancels");
  const reason = await blockAborted;
  assert.ok(reason instanceof RunEndedError, "the handler's signal was aborted because the run ended");
  await assert.rejects(run.result(), (e: unknown) => e instanceof ActionbusError && e.code === "canceled");
  blockStarted = new Promise<void>((r) => (blocked.started = r));
  blockAborted = new Promise<unknown>((r) => (blockEnded = r));
  // Work of the ended run still in the queue: answered, never run.
  const before = calls.get("ts.block") ?? 0;
  const res = await dispatch("ts.block", {}, {}, run.runId);
  assert.equal(res.type, Types.ActionFailed);
  assert.equal((res.data as { error: { code: string } }).error.code, "run_ended");
  assert.equal(calls.get("ts.block") ?? 0, before, "the handler was not called");
});

test("an idempotent mutation, approved from the TS client, is replayed the second time (E-IDEMPOTENCY, C-APPROVE)", async () => {
  const modes = ["read", "draft", "dryRun", "mutate"];
  const req = { action: { name: "ts.increment", args: { key: "k1" }, idempotencyKey: "idem-" + newId() }, allowedModes: modes };
  const first = await client.run(req);
  const evs1 = await approveWhenAsked(first.events);
  const r1 = resultOf(evs1)!;
  assert.ok(r1, `the first run has a result: ${evs1.map((e) => e.type).join(", ")}`);
  assert.equal(r1.type, Types.ActionCompleted, JSON.stringify(r1.data));
  assert.deepEqual((r1.data as { output: unknown }).output, { count: 1 });
  assert.equal(evs1.at(-1)!.type, Types.RunCompleted);

  const second = await client.run(req);
  const evs2 = await approveWhenAsked(second.events);
  const r2 = resultOf(evs2)!;
  assert.ok(r2, `the second run has a result: ${evs2.map((e) => e.type).join(", ")}`);
  assert.equal(r2.type, Types.ActionCompleted, JSON.stringify(r2.data));
  const d2 = r2.data as { output: unknown; replayed?: boolean };
  assert.deepEqual(d2.output, { count: 1 }, "the count did not move");
  assert.equal(d2.replayed, true);
  assert.equal(counters.get("k1"), 1, "the handler ran once");
});

test("an idempotency key is recorded in the Go executor's format, and refused for other input (E-IDEMPOTENCY)", async () => {
  const key = "idem-" + newId();
  const approval = (args: Record<string, unknown>) => ({ context: { approvalId: "a", runId: "r", stepId: "", userId: "", action: "ts.increment",
    inputHash: inputHash(args), dryRunMatches: false, expiresAt: new Date(Date.now() + 60_000).toISOString() }, token: "checked by the dispatcher" });
  const first = await dispatch("ts.increment", { key: "c1" }, { idempotencyKey: key, approval: approval({ key: "c1" }) });
  assert.equal(first.type, Types.ActionCompleted, JSON.stringify(first.data));
  const kv = await new Kvm(jetstream(nc)).open(`ab_idempotency_${pool}`);
  const entry = await kv.get(`${pool}.default.${createHash("sha256").update(key).digest("hex")}`);
  assert.ok(entry && entry.operation === "PUT", "the key is stored as <pool>.<tenant>.<sha256 of the key>");
  const rec = entry.json<Record<string, unknown>>();
  assert.equal(rec.state, "done");
  assert.equal(rec.callId, (first.data as { callId: string }).callId);
  assert.equal(rec.action, "ts.increment");
  assert.equal(rec.tenant, "default");
  assert.equal(rec.inputHash, inputHash({ key: "c1" }));
  assert.equal(rec.executor, ex.id);
  assert.deepEqual(rec.output, { count: 1 });
  assert.ok(!Number.isNaN(Date.parse(rec.reservedAt as string)));

  const other = await dispatch("ts.increment", { key: "c2" }, { idempotencyKey: key, approval: approval({ key: "c2" }) });
  assert.equal(other.type, Types.ActionFailed);
  const err = (other.data as { error: { code: string; details: { differs: string[] } } }).error;
  assert.equal(err.code, "idempotency_key_conflict");
  assert.deepEqual(err.details.differs, ["input"]);
  assert.equal(counters.get("c2"), undefined, "the handler did not run");
});

test("a mutate call without an approval is refused approval_required (E-APPROVAL)", async () => {
  const res = await dispatch("ts.increment", { key: "k2" });
  assert.equal((res.data as { error: { code: string } }).error.code, "approval_required");
  assert.equal(counters.get("k2"), undefined);
});

test("an output over the limit goes to the pool's artifact store (E-ARTIFACT)", async () => {
  const run = await client.run({ action: { name: "ts.big", args: { bytes: 300_000 } } });
  const evs = await collect(run.events);
  const res = resultOf(evs)!;
  assert.equal(res.type, Types.ActionCompleted);
  const d = res.data as { output: { artifact: { id: string; bytes: number; sha256: string; store: string; preview: string } }; artifacts: unknown[] };
  const ref = d.output.artifact;
  assert.ok(ref, "the output is an artifact reference");
  assert.equal(ref.store, `ab_artifacts_${pool}`);
  assert.equal(d.artifacts.length, 1);
  assert.ok(ref.preview.length <= 1024);
  const os = await new Objm(jetstream(nc)).open(ref.store);
  const data = await os.getBlob(ref.id);
  assert.ok(data);
  assert.equal(data.length, ref.bytes);
  assert.equal(createHash("sha256").update(data).digest("hex"), ref.sha256);
  assert.equal(JSON.parse(Buffer.from(data).toString("utf8")).data.length, 300_000);
  assert.equal(evs.at(-1)!.type, Types.RunCompleted);
});

test("follow and wait read a run that has ended from its stored events (C-FOLLOW, C-WAIT)", async () => {
  const run = await client.run({ action: { name: "ts.echo", args: { text: "followed" } } });
  await run.result();
  const evs = await collect(client.follow(run.runId));
  assert.ok(evs.some((e) => e.type === Types.ActionCompleted), "the result is among the stored events");
  assert.equal(evs.at(-1)!.type, Types.RunCompleted);
  const out = await client.wait(run.runId);
  assert.equal(out.runId, run.runId);
});

/**
 * runWithLive runs ts.echo with text and collects run.events while every
 * live event the client receives goes through deliver(push, ev) instead of
 * straight into the run's queue, and, with storeDown, the read service's
 * stored events fail to read.
 */
async function runWithLive(text: string, deliver: (push: (ev: Event) => void, ev: Event) => void, storeDown = false): Promise<Event[]> {
  type Live = { queue: { push: (ev: Event) => void }; stop: () => void };
  const c = client as unknown as { live: (runId: string) => Promise<Live>; storedEvents: (...a: unknown[]) => Promise<Event[]> };
  const { live, storedEvents } = c;
  c.live = async (runId: string) => {
    const sub = await live.call(client, runId);
    const push = sub.queue.push.bind(sub.queue);
    sub.queue.push = (ev: Event) => deliver(push, ev);
    return sub;
  };
  if (storeDown) c.storedEvents = async () => { throw new Error("the read service is down"); };
  try {
    const run = await client.run({ action: { name: "ts.echo", args: { text } } });
    return await collect(run.events);
  } finally {
    c.live = live;
    c.storedEvents = storedEvents;
  }
}

test("a result whose live copy is lost or overtaken by the end is yielded from the stored events, before the end (C-FOLLOW)", async () => {
  // Every live action.completed is dropped: what a terminal event
  // overtaking a result (two publishers, no order between them) or a
  // connection moving servers looks like to a follower.
  const evs = await runWithLive("overtaken", (push, ev) => { if (ev.type !== Types.ActionCompleted) push(ev); });
  const types = evs.map((e) => e.type);
  const at = types.indexOf(Types.ActionCompleted);
  assert.ok(at >= 0, `the result is yielded: ${types.join(", ")}`);
  assert.deepEqual((evs[at].data as { output: unknown }).output, { text: "overtaken" });
  assert.equal(types.at(-1), Types.RunCompleted, "the end comes last");
  assert.equal(types.filter((t) => t === Types.ActionCompleted).length, 1, "once");
});

test("a result that arrives live behind the end is yielded before it, the stream unread (C-FOLLOW)", async () => {
  // The live result is held back and pushed right after the end, as two
  // publishers' messages can arrive (or, should it come after the end of
  // itself, pushed as it comes); the read service answers nothing, so
  // only what came live can supply it.
  let held: Event | undefined;
  let ended = false;
  const evs = await runWithLive("behind", (push, ev) => {
    if (ev.type === Types.ActionCompleted && !ended) { held = ev; return; }
    push(ev);
    if (ev.type === Types.RunCompleted) {
      ended = true;
      if (held) push(held);
    }
  }, true);
  const types = evs.map((e) => e.type);
  assert.ok(types.includes(Types.ActionCompleted), `the result is yielded: ${types.join(", ")}`);
  assert.equal(types.at(-1), Types.RunCompleted, "the end comes last");
  assert.equal(types.filter((t) => t === Types.RunCompleted).length, 1, "one end");
});

test("signApproval is policy.Sign for a fixed context", () => {
  const want = process.env.ACTIONBUS_APPROVAL_TOKEN;
  assert.ok(want, "the Go test passes the token of its fixed context");
  const token = signApproval("k1", Buffer.from("0123456789abcdef0123456789abcdef"), {
    approvalId: "01JD0000000000000000000000-1-0", runId: "01JD0000000000000000000000", stepId: "", userId: "ada", action: "x.y",
    inputHash: "ab", dryRunMatches: false, expiresAt: "2026-12-03T14:00:00.5Z",
  });
  assert.equal(token, want);
});

test("a message that is no event becomes event.rejected and is acked (E-REJECT)", async () => {
  const sub = nc.subscribe("ab.rejected.>");
  await nc.flush();
  await jetstream(nc).publish(`ab.pool.${pool}.request`, Buffer.from("not an event"), { msgID: newId() });
  const timer = setTimeout(() => sub.unsubscribe(), 20_000);
  let rejected: Event | undefined;
  for await (const m of sub) { // the auditor, which reads the work stream too, rejects it as well
    const ev = decode(m.headers, m.data);
    if ((ev.data as { consumer?: string }).consumer === `pool-${pool}`) {
      rejected = ev;
      break;
    }
  }
  sub.unsubscribe();
  clearTimeout(timer);
  assert.ok(rejected, "an event.rejected was published");
  assert.equal(rejected.type, Types.EventRejected);
  const d = rejected.data as { reason: { code: string }; originalSubject: string; consumer: string; stream: string };
  assert.equal(d.reason.code, "malformed_event");
  assert.equal(d.originalSubject, `ab.pool.${pool}.request`);
  assert.equal(d.consumer, `pool-${pool}`);
  assert.equal(d.stream, "AB_WORK");
  const work = await jetstream(nc).consumers.get("AB_WORK", `pool-${pool}`);
  await eventually(async () => (await work.info()).num_ack_pending === 0, "the rejected message is acked");
});

test("a rejection keeps 32 KiB of a large body, with its size and hash (E-REJECT)", async () => {
  const body = Buffer.alloc(40 << 10, "z");
  const sub = nc.subscribe("ab.rejected.>");
  await nc.flush();
  await jetstream(nc).publish(`ab.pool.${pool}.request`, body, { msgID: newId() });
  const timer = setTimeout(() => sub.unsubscribe(), 20_000);
  let d: { originalData: string; originalDataBytes: number; originalDataHash: string } | undefined;
  for await (const m of sub) {
    const ev = decode(m.headers, m.data);
    const data = ev.data as { consumer?: string; originalDataBytes?: number };
    if (data.consumer === `pool-${pool}` && data.originalDataBytes === body.length) {
      d = ev.data as typeof d;
      break;
    }
  }
  sub.unsubscribe();
  clearTimeout(timer);
  assert.ok(d, "an event.rejected of the large body was published");
  assert.equal(Buffer.from(d.originalData, "base64").length, 32 << 10);
  assert.equal(d.originalDataHash, createHash("sha256").update(body).digest("hex"));
});

test("an idempotency record that fails its schema is refused invalid_record, never replayed (R-IDEMPOTENCY)", async () => {
  const key = "bad-record-" + newId();
  const kv = await new Kvm(jetstream(nc)).open(`ab_idempotency_${pool}`);
  await kv.put(`${pool}.default.${createHash("sha256").update(key).digest("hex")}`,
    JSON.stringify({ state: "done", callId: "x", output: { count: 99 }, forged: true }));
  const args = { key: "forged" };
  const approval = { context: { approvalId: "a", runId: "r", stepId: "", userId: "", action: "ts.increment", inputHash: inputHash(args),
    dryRunMatches: false, expiresAt: new Date(Date.now() + 60_000).toISOString() }, token: "checked by the dispatcher" };
  const res = await dispatch("ts.increment", args, { idempotencyKey: key, approval });
  assert.equal(res.type, Types.ActionFailed, JSON.stringify(res.data));
  const err = (res.data as { error: { code: string; details: { record: string } } }).error;
  assert.equal(err.code, "invalid_record");
  assert.equal(err.details.record, "idempotency_record");
  assert.equal(counters.get("forged"), undefined, "the handler did not run");
});

// A second pool, which the test serves by hand before an executor serves it.
const pool2 = process.env.ACTIONBUS_POOL2 ?? "tsdk2";
let ex2: Executor;
const stop2 = new AbortController();
let served2: Promise<void>;
let ran2 = 0;
let holding!: () => void;
const held = new Promise<void>((r) => (holding = r));

test("a request delivered MaxDeliver times is answered delivery_exhausted without running (E-REDELIVERY)", async () => {
  const { result } = await request(pool2, "ts2.echo", { text: "again" });
  const work = await jetstream(nc).consumers.get("AB_WORK", `pool-${pool2}`);
  for (let i = 1; i < MaxDeliver; i++) { // deliveries that crashed before answering
    const m = await work.next({ expires: 5_000 });
    assert.ok(m, `delivery ${i}`);
    assert.equal(m.info.deliveryCount, i);
    m.nak();
  }
  ex2 = new Executor(nc, { pool: pool2, slots: 1, shutdownGraceMs: 200 });
  ex2.registerAction({ name: "ts2.echo", description: "Echoes.", inputSchema: { type: "object" } }, () => { ran2++; return { output: {} }; });
  ex2.registerAction({ name: "ts2.hold", description: "Holds until aborted.", inputSchema: { type: "object" }, timeoutMs: 60_000 }, async (_i, call) => {
    holding();
    await new Promise((_r, reject) => call.signal.addEventListener("abort", () => reject(call.signal.reason), { once: true }));
    return { output: {} };
  });
  served2 = ex2.run(stop2.signal);
  served2.catch(() => {});
  const res = await result;
  assert.equal(res.type, Types.ActionFailed);
  const d = res.data as { error: { code: string }; deliveries: number };
  assert.equal(d.error.code, "delivery_exhausted");
  assert.equal(d.deliveries, MaxDeliver, "deliveries is JetStream's delivery count");
  assert.equal(ran2, 0, "the handler was not called");
});

test("at shutdown, a call not finished within the grace is handed back, unanswered (E-SHUTDOWN)", async () => {
  await ex2.ready;
  const { callId, result } = await request(pool2, "ts2.hold", {});
  let answered = false;
  void result.then(() => (answered = true), () => {});
  await held;
  stop2.abort();
  await served2; // drains: the handler is aborted past the grace, its message handed back
  const work = await jetstream(nc).consumers.get("AB_WORK", `pool-${pool2}`);
  const m = await work.next({ expires: 5_000 });
  assert.ok(m, "the work is back in the pool");
  assert.equal(m.info.deliveryCount, 2);
  assert.equal((decode(m.headers, m.data).data as { callId: string }).callId, callId);
  m.ack();
  assert.equal(answered, false, "no result was published for it");
});

test("a pool dedicated to other tenants answers tenant_not_served (E-TENANT)", async () => {
  const ex3 = new Executor(nc, { pool: pool2, slots: 1, tenants: ["acme"] });
  let ran = 0;
  ex3.registerAction({ name: "ts3.echo", description: "Echoes.", inputSchema: { type: "object" } }, () => { ran++; return { output: {} }; });
  const stop3 = new AbortController();
  const served3 = ex3.run(stop3.signal);
  await Promise.race([ex3.ready, served3.then(() => { throw new Error("the executor stopped before it was ready"); })]);
  try {
    const res = await (await request(pool2, "ts3.echo", {})).result;
    assert.equal(res.type, Types.ActionFailed);
    assert.equal((res.data as { error: { code: string } }).error.code, "tenant_not_served");
    assert.equal(ran, 0);
  } finally {
    stop3.abort();
    await served3;
  }
});

test("an announcement the registrar refuses stops the executor with its code (E-ANNOUNCE)", async () => {
  const ex4 = new Executor(nc, { pool: pool2, slots: 1 });
  // ts.echo belongs to the other pool: announcing it here would shadow it.
  ex4.registerAction({ name: "ts.echo", description: "Shadows.", inputSchema: { type: "object" } }, () => ({ output: {} }));
  await assert.rejects(ex4.run(new AbortController().signal), (e: unknown) => e instanceof ActionbusError && e.code === "catalog_conflict");
});
