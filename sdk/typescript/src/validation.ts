// Input preparation and validation issues, as the Go executor does them
// (internal/actions ArgsChecker, internal/schema): docs/protocol.md,
// "Validation issues" under E-INPUT, and E-OUTPUT.
import type { ErrorObject } from "ajv";
import { ActionbusError, Codes } from "./errors.js";

/** One reason an input is invalid: an action_args_invalid issue (E-INPUT). */
export interface ArgIssue {
  actionName: string;
  /** JSON Pointer of the offending value ("" the input); a missing property's own pointer. */
  key: string;
  /** The keyword that failed; "missing" for an absent required property; "invalid" when none applies. */
  reason: string;
  /** One sentence wording the rule, never the value. */
  error: string;
}

/** One schema violation: a schema_validation issue (E-OUTPUT). */
export interface SchemaIssue {
  /** JSON Pointer of the offending value ("" the document); a missing property's own pointer. */
  path: string;
  /** The keyword that failed ("required" for a missing property). */
  keyword: string;
  /** One sentence wording the rule, never the value. */
  reason: string;
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => v !== null && typeof v === "object" && !Array.isArray(v);

/** escape renders one JSON Pointer token (RFC 6901). */
export const escapeToken = (k: string) => k.replace(/~/g, "~0").replace(/\//g, "~1");

/** jsonType names the JSON type of v ("number" for every number, as Go's checker says). */
export function jsonType(v: unknown): string {
  if (v === null || v === undefined) return "null";
  if (Array.isArray(v)) return "array";
  switch (typeof v) {
    case "boolean": return "boolean";
    case "number": case "bigint": return "number";
    case "string": return "string";
  }
  return "object";
}

/** reasonOf words an ajv error by its rule, never by the rejected value (Go's schema.Reason); needs ajv's verbose option for "type". */
export function reasonOf(e: ErrorObject): string {
  const p = (e.params ?? {}) as Obj;
  switch (e.keyword) {
    case "type": return `must be of type ${([] as unknown[]).concat(p.type).join(" or ")}, got ${jsonType(e.data)}`;
    case "enum": return "must be one of the allowed values";
    case "const": return "must equal the constant value";
    case "format": return `must be a valid ${String(p.format)}`;
    case "pattern": return `must match pattern ${String(p.pattern)}`;
    case "minLength": case "maxLength": case "minItems": case "maxItems": case "minProperties": case "maxProperties":
      return `violates ${e.keyword} ${String(p.limit)}`;
    case "minimum": case "maximum": case "exclusiveMinimum": case "exclusiveMaximum":
      return `violates ${e.keyword} ${Number(p.limit).toFixed(6)}`;
    case "multipleOf": return `violates multipleOf ${Number(p.multipleOf).toFixed(6)}`;
    case "required": return "missing required property";
    case "additionalProperties": return `additional properties not allowed: ${String(p.additionalProperty)}`;
    case "propertyNames": return "has a property name that violates propertyNames";
    case "uniqueItems": {
      const [a, b] = [Number(p.i), Number(p.j)].sort((x, y) => x - y);
      return `items at ${a} and ${b} are equal`;
    }
    case "false schema": return "not allowed";
  }
  return e.keyword ? `violates ${e.keyword}` : "invalid";
}

/**
 * schemaIssues turns ajv's errors (allErrors, verbose) into the issues of
 * a schema_validation: only the leaf violations (an anyOf, if, … whose
 * branches' errors are listed is not one), a missing property at its own
 * pointer, the properties additionalProperties refuses in one issue at
 * their object, sorted by path.
 */
export function schemaIssues(errors: readonly ErrorObject[] | null | undefined): SchemaIssue[] {
  const list = errors ?? [];
  const out: SchemaIssue[] = [];
  const extra = new Map<string, string[]>();
  for (const e of list) {
    if (e.keyword === "if" || list.some((o) => o !== e && o.schemaPath.startsWith(e.schemaPath + "/"))) continue; // not a leaf: its then/else, branches, … are listed
    const p = (e.params ?? {}) as Obj;
    if (e.keyword === "required") {
      out.push({ path: `${e.instancePath}/${escapeToken(String(p.missingProperty))}`, keyword: "required", reason: "missing required property" });
    } else if (e.keyword === "additionalProperties") {
      const names = extra.get(e.instancePath) ?? [];
      if (names.length === 0) extra.set(e.instancePath, names);
      names.push(String(p.additionalProperty));
    } else {
      out.push({ path: e.instancePath, keyword: e.keyword === "false schema" ? "" : e.keyword, reason: reasonOf(e) });
    }
  }
  for (const [path, names] of extra) out.push({ path, keyword: "additionalProperties", reason: `additional properties not allowed: ${names.join(", ")}` });
  return out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/** joinIssues is a schema_validation message: `<path or "/">: <reason>` joined with "; ". */
export function joinIssues(issues: readonly SchemaIssue[]): string {
  return issues.map((i) => `${i.path || "/"}: ${i.reason}`).join("; ");
}

/** schemaError is the schema_validation failure of issues (E-OUTPUT). */
export function schemaError(issues: SchemaIssue[]): ActionbusError {
  return new ActionbusError(Codes.SchemaValidation, joinIssues(issues) || "invalid", { issues });
}

/** argIssues turns schema issues into action_args_invalid issues: required is "missing", no keyword "invalid". */
export function argIssues(action: string, issues: readonly SchemaIssue[]): ArgIssue[] {
  return issues.map((i) => ({ actionName: action, key: i.path,
    reason: i.keyword === "required" ? "missing" : i.keyword === "" ? "invalid" : i.keyword, error: i.reason }));
}

/** A zod issue as far as argIssuesOfZod reads one (zod 4). */
export interface ZodIssueLike {
  path: PropertyKey[];
  message: string;
  code?: string;
  expected?: string;
  origin?: string;
  maximum?: unknown;
  minimum?: unknown;
  keys?: string[];
  format?: string;
  pattern?: string;
  divisor?: unknown;
}

const pointer = (path: readonly PropertyKey[]) => path.map((t) => "/" + escapeToken(String(t))).join("");

function valueAt(doc: unknown, path: readonly PropertyKey[]): unknown {
  let cur = doc;
  for (const t of path) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<string, unknown>)[String(t)];
  }
  return cur;
}

/** argIssuesOfZod turns zod's issues into action_args_invalid issues worded as the Go checker words them. */
export function argIssuesOfZod(action: string, input: unknown, issues: readonly ZodIssueLike[]): ArgIssue[] {
  const out = issues.map((i): ArgIssue => {
    const key = pointer(i.path);
    const issue = (reason: string, error: string): ArgIssue => ({ actionName: action, key, reason, error });
    const sized = (big: boolean) => {
      const kw = i.origin === "string" ? (big ? "maxLength" : "minLength") : i.origin === "array" || i.origin === "set" ? (big ? "maxItems" : "minItems")
        : i.origin === "object" ? (big ? "maxProperties" : "minProperties") : big ? "maximum" : "minimum";
      const limit = big ? i.maximum : i.minimum;
      return issue(kw, `violates ${kw} ${kw === "maximum" || kw === "minimum" ? Number(limit).toFixed(6) : String(limit)}`);
    };
    switch (i.code) {
      case "invalid_type":
        if (valueAt(input, i.path) === undefined) return issue("missing", "missing required property");
        return issue("type", `must be of type ${i.expected ?? "another type"}, got ${jsonType(valueAt(input, i.path))}`);
      case "too_big": return sized(true);
      case "too_small": return sized(false);
      case "unrecognized_keys": return issue("additionalProperties", `additional properties not allowed: ${(i.keys ?? []).join(", ")}`);
      case "invalid_value": return issue("enum", "must be one of the allowed values");
      case "invalid_format":
        return i.format === "regex" ? issue("pattern", `must match pattern ${i.pattern ?? ""}`) : issue("format", `must be a valid ${i.format ?? "value"}`);
      case "not_multiple_of": return issue("multipleOf", `violates multipleOf ${Number(i.divisor).toFixed(6)}`);
    }
    return issue("invalid", i.message);
  });
  return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

/** argsError is the action_args_invalid failure of issues: the first issue repeated at the top, every one under issues. */
export function argsError(action: string, issues: ArgIssue[]): ActionbusError {
  const list = issues.length > 0 ? issues : [{ actionName: action, key: "", reason: "invalid", error: "invalid" }];
  const first = list[0];
  return new ActionbusError(Codes.ActionArgsInvalid,
    `arguments of ${action} are invalid: ${list.map((i) => `${i.key || "/"}: ${i.error}`).join("; ")}`,
    { actionName: action, key: first.key, reason: first.reason, error: first.error, issues: list });
}

/**
 * Prepared is an input made ready for validation, as the Go executor's
 * ArgsChecker.Prepare makes it: keys beside healFlattenedInto lifted into
 * it (unless it holds a non-empty object already); aliases a property
 * lists in "x-aliases" renamed to it (the property wins a collision); for
 * input whose origin is not "host", the
 * hostOnlyKeys and the keys the schema does not declare (recursively;
 * an object schema without properties declares nothing and strips
 * nothing) removed; optional top-level keys given as null removed (unless
 * their schema admits null); required top-level values given as null or
 * as a string of only whitespace reported missing.
 */
export interface Prepared {
  input: Obj;
  /** Issues of required values given as null or blank (reason missing). */
  blank: ArgIssue[];
  healed: string[];
  rewrites: { path: string; from: string; to: string; collision: boolean }[];
  stripped: string[];
  hostOnlyStripped: string[];
  nullAbsent: string[];
}

/** What of an action's definition input preparation reads besides its input schema. */
export interface PrepareOptions {
  hostOnlyKeys?: readonly string[];
  healFlattenedInto?: string;
}

/** prepareArgs prepares args for action (its input schema root and opts); args is not modified. */
export function prepareArgs(action: string, root: Obj | undefined, opts: PrepareOptions, args: Obj | undefined, origin: string | undefined): Prepared {
  const input = (isObj(args) ? structuredClone(args) : {}) as Obj;
  const rep: Prepared = { input, blank: [], healed: [], rewrites: [], stripped: [], hostOnlyStripped: [], nullAbsent: [] };
  const resolve = (s: unknown): Obj | undefined => {
    let cur = isObj(s) ? s : undefined;
    for (let i = 0; i < 8 && cur; i++) {
      const ref = cur.$ref;
      if (typeof ref !== "string" || !ref.startsWith("#/")) return cur;
      let next: unknown = root;
      for (const tok of ref.slice(2).split("/")) next = isObj(next) ? next[tok.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined;
      if (!isObj(next)) return cur;
      cur = next;
    }
    return cur;
  };
  const properties = (s: unknown): Obj | undefined => {
    const p = resolve(s)?.properties;
    return isObj(p) ? p : undefined;
  };
  if (root) {
    const into = opts.healFlattenedInto;
    const cur = into ? input[into] : undefined;
    if (into && !(isObj(cur) && Object.keys(cur).length > 0)) {
      const props = properties(root) ?? {};
      const lifted: Obj = {};
      for (const k of Object.keys(input)) {
        if (Object.hasOwn(props, k) || k === "reasoning") continue;
        lifted[k] = input[k];
        delete input[k];
        rep.healed.push(k);
      }
      rep.healed.sort();
      if (Object.keys(lifted).length > 0) input[into] = lifted;
    }
    const rewrite = (s: unknown, obj: Obj, path: string) => {
      const props = properties(s) ?? {};
      for (const canonical of Object.keys(props).sort()) {
        const ps = resolve(props[canonical]);
        const raw = ps?.["x-aliases"];
        const aliases = Array.isArray(raw) ? raw : typeof raw === "string" ? raw.split(",").map((a) => a.trim()) : [];
        for (const a of aliases) {
          if (typeof a !== "string" || a === "" || a === canonical || !Object.hasOwn(obj, a)) continue;
          const collision = Object.hasOwn(obj, canonical);
          if (!collision) obj[canonical] = obj[a];
          delete obj[a];
          rep.rewrites.push({ path, from: a, to: canonical, collision });
        }
        if (isObj(obj[canonical]) && ps) rewrite(ps, obj[canonical] as Obj, `${path}/${escapeToken(canonical)}`);
      }
    };
    rewrite(root, input, "");
  }
  if (origin !== "host") {
    for (const k of opts.hostOnlyKeys ?? []) {
      if (k in input) {
        delete input[k];
        rep.hostOnlyStripped.push("/" + escapeToken(k));
      }
    }
    const strip = (s: unknown, obj: Obj, path: string) => {
      const props = properties(s);
      if (!props) return;
      for (const k of Object.keys(obj)) {
        if (!Object.hasOwn(props, k) || !isObj(props[k])) {
          delete obj[k];
          rep.stripped.push(`${path}/${escapeToken(k)}`);
        } else if (isObj(obj[k])) {
          strip(props[k], obj[k] as Obj, `${path}/${escapeToken(k)}`);
        }
      }
    };
    if (root) strip(root, input, "");
  }
  if (root) {
    const required = new Set((Array.isArray(resolve(root)?.required) ? resolve(root)!.required as unknown[] : []).filter((k): k is string => typeof k === "string"));
    const props = properties(root) ?? {};
    for (const k of Object.keys(input)) {
      if (input[k] !== null || required.has(k) || admitsNull(resolve(props[k]))) continue;
      delete input[k];
      rep.nullAbsent.push("/" + escapeToken(k));
    }
    for (const k of required) {
      if (!Object.hasOwn(input, k)) continue; // the schema reports it
      const v = input[k];
      if (v === null) rep.blank.push({ actionName: action, key: "/" + escapeToken(k), reason: "missing", error: "required value is null" });
      else if (typeof v === "string" && v.trim() === "") rep.blank.push({ actionName: action, key: "/" + escapeToken(k), reason: "missing", error: "required string is blank" });
    }
  }
  rep.stripped.sort();
  rep.hostOnlyStripped.sort();
  rep.nullAbsent.sort();
  return rep;
}

function admitsNull(s: Obj | undefined): boolean {
  const t = s?.type;
  return t === "null" || (Array.isArray(t) && t.includes("null"));
}

/** withBlank puts the blank issues first and drops the schema's issues at their keys (reported missing already). */
export function withBlank(blank: ArgIssue[], issues: ArgIssue[]): ArgIssue[] {
  const keys = new Set(blank.map((b) => b.key));
  return [...blank, ...issues.filter((i) => !keys.has(i.key))];
}
