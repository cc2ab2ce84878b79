// RFC 8785 canonical JSON (JCS) and the stable hash of inputs
// (policy.InputHash: SHA-256 over the canonical form, hex).
import { createHash } from "node:crypto";

/** canonicalJSON returns the RFC 8785 form of v (sorted keys, ES number form, no whitespace). */
export function canonicalJSON(v: unknown): string {
  if (v === null || typeof v !== "object") {
    if (typeof v === "number" && !Number.isFinite(v)) throw new TypeError("canonicalJSON: a number must be finite");
    return JSON.stringify(v ?? null);
  }
  if (Array.isArray(v)) return "[" + v.map((x) => canonicalJSON(x === undefined ? null : x)).join(",") + "]";
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o).filter((k) => o[k] !== undefined).sort();
  return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonicalJSON(o[k])).join(",") + "}";
}

/** inputHash is the stable hash of an action's input (approvals bind it). */
export function inputHash(input: unknown): string {
  return createHash("sha256").update(canonicalJSON(input ?? {}), "utf8").digest("hex");
}
