// Unit tests of what the executor checks without NATS: input preparation
// and issues (E-INPUT), output issues (E-OUTPUT), the event.rejected data
// (E-REJECT) and idempotency records (R-IDEMPOTENCY), each against what
// the Go executor does. Run alone: node --test dist-test/test/validation.test.js
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Ajv2020 } from "ajv/dist/2020.js";
import { z } from "zod";
import {
  ActionbusError, argIssues, argIssuesOfZod, argsError, decodeRecord, MaxRejectedData, prepareArgs, RecordSchema, rejection, schemaError,
  schemaIssues, withBlank, type ArgIssue,
} from "../src/index.js";

const ajv = new Ajv2020({ strict: false, allErrors: true, verbose: true }); // the executor's options
const echo = { type: "object", properties: { text: { type: "string", maxLength: 1000 } }, required: ["text"], additionalProperties: false };
const validateEcho = ajv.compile(echo);

// The executor's E-INPUT path, with a JSON Schema: prepare, validate, join.
function check(args: Record<string, unknown>, origin = "host", schema: Record<string, unknown> = echo, hostOnly?: string[]) {
  const validate = schema === echo ? validateEcho : ajv.compile(schema);
  const prep = prepareArgs("conformance.echo", schema, { hostOnlyKeys: hostOnly }, args, origin);
  const issues: ArgIssue[] = validate(prep.input) ? [] : argIssues("conformance.echo", schemaIssues(validate.errors));
  return { prep, issues: withBlank(prep.blank, issues) };
}

test("a missing required property is an issue at its own key, reason missing (E-INPUT)", () => {
  const { issues } = check({});
  assert.deepEqual(issues, [{ actionName: "conformance.echo", key: "/text", reason: "missing", error: "missing required property" }]);
  const err = argsError("conformance.echo", issues).toJSON();
  assert.equal(err.code, "action_args_invalid");
  assert.deepEqual(err.details, { actionName: "conformance.echo", key: "/text", reason: "missing", error: "missing required property", issues });
  assert.equal(err.message, "arguments of conformance.echo are invalid: /text: missing required property");
});

test("a type mismatch is reason type, worded by the rule, never the value (E-INPUT)", () => {
  const { issues } = check({ text: 918273645 });
  assert.deepEqual(issues, [{ actionName: "conformance.echo", key: "/text", reason: "type", error: "must be of type string, got number" }]);
  const err = argsError("conformance.echo", issues);
  assert.equal(err.message, "arguments of conformance.echo are invalid: /text: must be of type string, got number", "protocol.md's example");
  assert.ok(!JSON.stringify(err.toJSON()).includes("918273645"));
  const long = check({ text: "x".repeat(1001) }).issues;
  assert.deepEqual(long.map((i) => [i.key, i.reason, i.error]), [["/text", "maxLength", "violates maxLength 1000"]]);
});

test("host input keeps an undeclared key, refused as one additionalProperties issue at its object (E-INPUT)", () => {
  const { issues } = check({ text: 5, extra: true, more: 1 });
  assert.deepEqual(issues.map((i) => [i.key, i.reason, i.error]), [
    ["", "additionalProperties", "additional properties not allowed: extra, more"],
    ["/text", "type", "must be of type string, got number"],
  ], "sorted by key, as Go's");
});

test("input that is not the host's loses undeclared keys, nested too, and hostOnlyKeys (E-INPUT)", () => {
  const schema = { type: "object", properties: { text: { type: "string" }, owner: { type: "string" }, opts: { type: "object", properties: { a: { type: "integer" } } },
    free: { type: "object" } }, required: ["text"], additionalProperties: false };
  const args = { text: "hi", owner: "root", extra: 1, opts: { a: 1, b: 2 }, free: { anything: true } };
  const model = check(args, "model", schema, ["owner"]);
  assert.deepEqual(model.issues, []);
  assert.deepEqual(model.prep.input, { text: "hi", opts: { a: 1 }, free: { anything: true } });
  assert.deepEqual(model.prep.stripped, ["/extra", "/opts/b"]);
  assert.deepEqual(model.prep.hostOnlyStripped, ["/owner"]);
  assert.deepEqual(args.opts, { a: 1, b: 2 }, "the request's args are not modified");
  const host = check(args, "host", schema, ["owner"]);
  assert.deepEqual(host.issues.map((i) => [i.key, i.reason, i.error]), [["", "additionalProperties", "additional properties not allowed: extra"]]);
  assert.equal(host.prep.input.owner, "root", "the host may set a host-only key");
});

test("a required value given as null or blank is missing; an optional null is absent (E-INPUT)", () => {
  const schema = { type: "object", properties: { text: { type: "string" }, note: { type: "string" }, maybe: { type: ["string", "null"] } }, required: ["text"] };
  assert.deepEqual(check({ text: null }, "host", schema).issues, [{ actionName: "conformance.echo", key: "/text", reason: "missing", error: "required value is null" }],
    "not a type error as well");
  assert.deepEqual(check({ text: "  \t" }, "host", schema).issues, [{ actionName: "conformance.echo", key: "/text", reason: "missing", error: "required string is blank" }]);
  const ok = check({ text: "t", note: null, maybe: null }, "host", schema);
  assert.deepEqual(ok.issues, []);
  assert.deepEqual(ok.prep.input, { text: "t", maybe: null }, "a key whose schema admits null keeps it");
  assert.deepEqual(ok.prep.nullAbsent, ["/note"]);
});

test("aliases are renamed and flattened arguments lifted, as Go's checker does, whatever the origin (E-INPUT)", () => {
  const schema = { type: "object", properties: { query: { type: "string", "x-aliases": ["q", "search"] }, args: { type: "object" } }, required: ["query"] };
  const p = prepareArgs("a", schema, {}, { q: "x", search: "y" }, "model");
  assert.deepEqual(p.input, { query: "x" });
  assert.deepEqual(p.rewrites, [{ path: "", from: "q", to: "query", collision: false }, { path: "", from: "search", to: "query", collision: true }]);
  const h = prepareArgs("a", schema, { healFlattenedInto: "args" }, { query: "x", reasoning: "r", city: "Oslo" }, "host");
  assert.deepEqual(h.input, { query: "x", reasoning: "r", args: { city: "Oslo" } });
  assert.deepEqual(h.healed, ["city"]);
  const kept = prepareArgs("a", schema, { healFlattenedInto: "args" }, { query: "x", args: { a: 1 }, city: "Oslo" }, "host");
  assert.deepEqual(kept.input, { query: "x", args: { a: 1 }, city: "Oslo" }, "a wrapper that holds something is left alone");
});

test("zod issues are worded and keyed as the Go checker's (E-INPUT)", () => {
  const schema = z.object({ sku: z.string().min(2), n: z.number().max(5) }).strict();
  const input = { n: 918273645, extra: true };
  const r = schema.safeParse(input);
  assert.ok(!r.success);
  const issues = argIssuesOfZod("inventory.checkStock", input, r.error.issues);
  assert.deepEqual(issues.map((i) => [i.key, i.reason]), [["", "additionalProperties"], ["/n", "maximum"], ["/sku", "missing"]]);
  assert.ok(!JSON.stringify(issues).includes("918273645"));
  const typed = schema.safeParse({ sku: 7, n: 1 });
  assert.ok(!typed.success);
  assert.deepEqual(argIssuesOfZod("x", { sku: 7, n: 1 }, typed.error.issues), [{ actionName: "x", key: "/sku", reason: "type", error: "must be of type string, got number" }]);
});

test("an output failing its schema: schema_validation, issues {path, keyword, reason} sorted by path (E-OUTPUT)", () => {
  const validate = ajv.compile({ type: "object", properties: { count: { type: "integer" }, name: { type: "string" } }, required: ["count", "name"] });
  assert.equal(validate({ name: 918273645 }), false);
  const err = schemaError(schemaIssues(validate.errors)).toJSON();
  assert.equal(err.code, "schema_validation");
  assert.deepEqual(err.details, { issues: [
    { path: "/count", keyword: "required", reason: "missing required property" },
    { path: "/name", keyword: "type", reason: "must be of type string, got number" },
  ] });
  assert.equal(err.message, "/count: missing required property; /name: must be of type string, got number");
  const anyOf = ajv.compile({ anyOf: [{ type: "string" }, { type: "integer", minimum: 3 }] });
  assert.equal(anyOf(1), false);
  assert.deepEqual(schemaIssues(anyOf.errors).map((i) => i.keyword), ["type", "minimum"], "only the leaves, as Go's");
  const ifThen = ajv.compile({ if: { properties: { a: { const: 1 } } }, then: { required: ["b"] } });
  assert.equal(ifThen({ a: 1 }), false);
  assert.deepEqual(schemaIssues(ifThen.errors), [{ path: "/b", keyword: "required", reason: "missing required property" }]);
});

test("a rejection keeps 32 KiB of the body with the whole body's size and hash, as Go's bus (E-REJECT)", () => {
  const body = Buffer.alloc(40 << 10, "y");
  const base = { reason: { code: "malformed_event", message: "m" }, subject: "ab.pool.p.request", headers: { a: ["1"] }, consumer: "pool-p",
    stream: "AB_WORK", streamSequence: 7, maxPayload: 1 << 20 };
  const d = rejection({ ...base, data: body });
  assert.equal(Buffer.from(d.originalData!, "base64").length, MaxRejectedData);
  assert.equal(MaxRejectedData, 32 << 10);
  assert.equal(d.originalDataBytes, body.length);
  assert.equal(d.originalDataHash, createHash("sha256").update(body).digest("hex"));
  const small = rejection({ ...base, data: Buffer.from("conformance: not a CloudEvent") });
  assert.equal(small.originalData, Buffer.from("conformance: not a CloudEvent").toString("base64"));
  assert.equal(small.originalDataBytes, undefined, "a whole body carries no size and hash");
  assert.equal(small.originalDataHash, undefined);
  const tight = rejection({ ...base, data: body, maxPayload: 16 << 10, reason: { code: "x", message: "é".repeat(2000) } });
  assert.ok(Buffer.byteLength(JSON.stringify(tight)) <= 4 << 10, "within a quarter of the max payload");
  assert.equal(tight.originalDataBytes, body.length, "the size and hash of the whole stay");
  assert.ok(!tight.reason.message.includes("\ufffd"), "cut at a character boundary");
});

test("an idempotency record that fails schemas/idempotency-record.json is refused invalid_record (R-IDEMPOTENCY)", () => {
  const good = { state: "done", callId: "c", executor: "e", reservedAt: "2026-12-03T14:00:01Z", timeoutMs: 30000, action: "conformance.increment",
    tenant: "acme", inputHash: "h", output: { count: 1 } };
  const enc = (v: unknown) => Buffer.from(JSON.stringify(v));
  assert.deepEqual(decodeRecord("k", enc(good)), good);
  for (const [what, rec] of [
    ["an unknown state", { ...good, state: "maybe" }],
    ["no callId", { ...good, callId: undefined }],
    ["a bad date", { ...good, reservedAt: "yesterday" }],
    ["an extra key", { ...good, extra: 1 }],
    ["a bad tenant", { ...good, tenant: "ACME" }],
  ] as const) {
    assert.throws(() => decodeRecord("k", enc(rec)), (e: unknown) => e instanceof ActionbusError && e.code === "invalid_record"
      && (e.details as { record: string }).record === "idempotency_record" && Array.isArray((e.details as { issues: unknown[] }).issues), what);
  }
  assert.throws(() => decodeRecord("k", Buffer.from("{")), (e: unknown) => e instanceof ActionbusError && e.code === "invalid_record");
});

test("the SDK's record schema is schemas/idempotency-record.json, references inlined", () => {
  const root = fileURLToPath(new URL("../../../../schemas/", import.meta.url)); // from dist-test/test
  const file = JSON.parse(readFileSync(root + "idempotency-record.json", "utf8"));
  const defs = JSON.parse(readFileSync(root + "defs.json", "utf8"));
  const actionDef = JSON.parse(readFileSync(root + "action-definition.json", "utf8"));
  const strip = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(strip);
    if (v && typeof v === "object") {
      const o = v as Record<string, unknown>;
      if (o.$ref === "action-definition.json#/$defs/name") return strip(actionDef.$defs.name);
      if (o.$ref === "defs.json#/$defs/tenant") return strip(defs.$defs.tenant);
      return Object.fromEntries(Object.entries(o).filter(([k]) => !["$schema", "$id", "title", "description"].includes(k)).map(([k, x]) => [k, strip(x)]));
    }
    return v;
  };
  assert.deepEqual(strip(RecordSchema), strip(file));
});
