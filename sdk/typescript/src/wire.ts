// The data of the events the SDK reads and writes (schemas/*.json).

/** An action mode: what the action does to the world. */
export type Mode = "read" | "draft" | "dryRun" | "mutate";

/** ApprovalContext is what an approval is bound to (events.ApprovalContext). */
export interface ApprovalContext {
  approvalId: string;
  runId: string;
  stepId: string;
  userId: string;
  action: string;
  inputHash: string;
  resourceIds?: string[];
  dryRunHash?: string;
  dryRunAction?: string;
  dryRunMatches: boolean;
  expiresAt: string;
}

/** ApprovalGrant is a verified approval as the executor receives it. */
export interface ApprovalGrant {
  context: ApprovalContext;
  token: string;
  approver?: string;
}

/** ActionRequested is a work item (schemas/action.requested.json). */
export interface ActionRequested {
  runId: string;
  tenant?: string;
  callId: string;
  cycle: number;
  planIndex: number;
  attempt: number;
  action: string;
  args: Record<string, unknown>;
  origin: string;
  userId?: string;
  timeoutMs?: number;
  idempotencyKey?: string;
  approval?: ApprovalGrant;
  stepId?: string;
  maxAttempts?: number;
}

/** ArtifactRef names a stored artifact (events.ArtifactRef). */
export interface ArtifactRef {
  id: string;
  role: string;
  mediaType: string;
  bytes: number;
  previewSize: number;
  sha256: string;
  truncated: boolean;
  preview?: string;
  store?: string;
}

/** WireError is an error on the wire. */
export interface WireError {
  code: string;
  message: string;
  details?: Record<string, unknown>;
}

/** The tenant of an empty tenant field. */
export const DefaultTenant = "default";

/** tenantOr returns t, or the default tenant when t is empty. */
export function tenantOr(t: string | undefined): string {
  return t ? t : DefaultTenant;
}
