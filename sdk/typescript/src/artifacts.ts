// E-ARTIFACT: artifacts in the pool's object store ("<prefix>_artifacts_<pool>"),
// recorded for their tenant and run, as internal/artifacts does.
import { createHash } from "node:crypto";
import { headers } from "@nats-io/transport-node";
import type { ObjectStore } from "@nats-io/obj";
import { tenantOr, type ArtifactRef } from "./wire.js";

/** putArtifact stores data under id and returns its reference with a preview of at most previewBytes (cut at a UTF-8 boundary). */
export interface ArtifactStore {
  name: string;
  os: ObjectStore;
}

export async function putArtifact(store: ArtifactStore, owner: { tenant?: string; runId: string }, id: string, role: string, mediaType: string,
  data: Uint8Array, previewBytes: number): Promise<ArtifactRef> {
  const h = headers();
  h.set("Content-Type", mediaType);
  await store.os.putBlob({ name: id, description: role, headers: h, metadata: { tenant: tenantOr(owner.tenant), run: owner.runId } }, data);
  const sha256 = createHash("sha256").update(data).digest("hex");
  let preview = Buffer.from(data.subarray(0, Math.min(previewBytes, data.length)));
  const dec = new TextDecoder("utf-8", { fatal: true });
  for (;;) {
    try { dec.decode(preview); break; } catch { preview = preview.subarray(0, preview.length - 1); }
  }
  return { id, role, mediaType, bytes: data.length, previewSize: preview.length, sha256, truncated: preview.length < data.length,
    preview: preview.toString("utf8"), store: store.name };
}
