// Typed errors carrying the stable codes of actionbus (errors.go): every
// failure that crosses the bus is an ActionbusError, matched by its code.

/** The stable codes this SDK sends or recognizes (a subset of errors.go). */
export const Codes = {
  ActionNotFound: "action_not_found",
  ActionArgsInvalid: "action_args_invalid",
  SchemaValidation: "schema_validation",
  HandlerFailed: "handler_failed",
  Timeout: "timeout",
  Canceled: "canceled",
  RunEnded: "run_ended",
  DeliveryExhausted: "delivery_exhausted",
  TenantNotServed: "tenant_not_served",
  ApprovalRequired: "approval_required",
  ApprovalInvalid: "approval_invalid",
  IdempotencyConflict: "idempotency_key_conflict",
  RegistrarUnavailable: "registrar_unavailable",
  PayloadTooLarge: "payload_too_large",
  MalformedEvent: "malformed_event",
  UnknownEventType: "unknown_event_type",
  EventRejected: "event_rejected",
  ApprovalNotFound: "approval_not_found",
  InvalidRecord: "invalid_record",
  Internal: "internal",
} as const;

/** An error with a stable code, as actionbus.Error on the wire. */
export class ActionbusError extends Error {
  readonly code: string;
  readonly details?: Record<string, unknown>;

  constructor(code: string, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = "ActionbusError";
    this.code = code;
    if (details && Object.keys(details).length > 0) this.details = details;
  }

  /** The wire form: {code, message, details?}. */
  toJSON(): { code: string; message: string; details?: Record<string, unknown> } {
    return this.details ? { code: this.code, message: this.message, details: this.details } : { code: this.code, message: this.message };
  }

  /** An error read from the wire ({code, message, details}). */
  static from(v: unknown): ActionbusError {
    const o = (v ?? {}) as { code?: string; message?: string; details?: Record<string, unknown> };
    return new ActionbusError(o.code ?? Codes.Internal, o.message ?? "", o.details);
  }
}

/** codeOf returns the code of err: its own for an ActionbusError, handler_failed otherwise. */
export function codeOf(err: unknown): string {
  return err instanceof ActionbusError ? err.code : Codes.HandlerFailed;
}
