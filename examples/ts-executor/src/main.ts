// An actionbus executor in TypeScript. It hosts the conformance catalog
// (docs/protocol.md: conformance.echo, .sleep, .big, .increment, .shape), which
// `actionbus conformance executor --pool POOL` drives, and one domain
// action, inventory.checkStock (a zod schema).
//
//   NATS_URL=nats://127.0.0.1:4222 [NATS_CREDS=file] POOL=ts node dist/main.js
//
// The pool's consumer must exist (actionbus provision --pool POOL). It
// prints "ts-executor ready" once the registrar recorded its actions, and
// drains on SIGINT or SIGTERM.
import { connect, credsAuthenticator } from "@nats-io/transport-node";
import { readFileSync } from "node:fs";
import { z } from "zod";
import { ActionbusError, Executor } from "@actionbus/sdk";

const nc = await connect({
  servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  authenticator: process.env.NATS_CREDS ? credsAuthenticator(readFileSync(process.env.NATS_CREDS)) : undefined,
  name: "ts-executor",
});
const ex = new Executor(nc, {
  pool: process.env.POOL ?? "default",
  slots: Number(process.env.SLOTS ?? 4),
  logger: { info: (m, a) => console.log(m, a ?? ""), warn: (m, a) => console.warn(m, a ?? "") },
});

ex.registerAction({
  name: "conformance.echo", mode: "read", description: "Returns its text (conformance catalog).",
  inputSchema: { type: "object", properties: { text: { type: "string", maxLength: 1000 } }, required: ["text"], additionalProperties: false },
  outputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
}, (input: { text: string }) => ({ output: { text: input.text }, summary: `echoed ${input.text.length} characters` }));

ex.registerAction({
  name: "conformance.sleep", mode: "read", timeoutMs: 1000, description: "Waits ms milliseconds, honouring cancellation (conformance catalog).",
  inputSchema: { type: "object", properties: { ms: { type: "integer", minimum: 0, maximum: 60000 } }, required: ["ms"], additionalProperties: false },
  outputSchema: { type: "object", properties: { slept: { type: "integer" } }, required: ["slept"] },
}, async (input: { ms: number }, call) => {
  await new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, input.ms);
    call.signal.addEventListener("abort", () => { clearTimeout(t); reject(call.signal.reason); }, { once: true });
  });
  return { output: { slept: input.ms } };
});

ex.registerAction({
  name: "conformance.big", mode: "read", description: "Returns a string of bytes 'x' characters (conformance catalog).",
  inputSchema: { type: "object", properties: { bytes: { type: "integer", minimum: 1, maximum: 4194304 } }, required: ["bytes"], additionalProperties: false },
  outputSchema: { type: "object", properties: { data: { type: "string" } }, required: ["data"] },
}, (input: { bytes: number }) => ({ output: { data: "x".repeat(input.bytes) } }));

const counters = new Map<string, number>();
ex.registerAction({
  name: "conformance.increment", mode: "mutate", description: "Increments the in-memory counter of key (conformance catalog).",
  inputSchema: { type: "object", properties: { key: { type: "string" } }, required: ["key"], additionalProperties: false },
  outputSchema: { type: "object", properties: { count: { type: "integer" } }, required: ["count"] },
}, (input: { key: string }) => {
  const count = (counters.get(input.key) ?? 0) + 1;
  counters.set(input.key, count);
  return { output: { count }, summary: `${input.key} is now ${count}` };
});

ex.registerAction({
  name: "conformance.shape", mode: "read", description: "Returns the object output of its input, checked by its output schema (conformance catalog).",
  inputSchema: { type: "object", properties: { output: { type: "object" } }, required: ["output"], additionalProperties: false },
  outputSchema: { type: "object", properties: { count: { type: "integer" }, name: { type: "string" } }, required: ["count", "name"] },
}, (input: { output: Record<string, unknown> }) => ({ output: input.output, summary: "shaped" }));

const stock: Record<string, number> = { "SKU-1": 12, "SKU-2": 0 };
ex.registerAction({
  name: "inventory.checkStock", mode: "read", description: "Units in stock of one SKU.",
  schema: z.object({ sku: z.string().min(1) }).strict(),
  outputSchema: { type: "object", properties: { sku: { type: "string" }, units: { type: "integer" } }, required: ["sku", "units"] },
}, (input: { sku: string }) => {
  const units = stock[input.sku];
  if (units === undefined) throw new ActionbusError("not_found", `no SKU ${input.sku}`);
  return { output: { sku: input.sku, units }, summary: `${units} units of ${input.sku}` };
});

const stop = new AbortController();
for (const sig of ["SIGINT", "SIGTERM"] as const) process.on(sig, () => stop.abort());
void ex.ready.then(() => console.log("ts-executor ready", ex.id));
try {
  await ex.run(stop.signal);
} catch (err) {
  console.error("ts-executor:", err);
  process.exitCode = 1;
}
await nc.drain();
