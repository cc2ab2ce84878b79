// Package actionbus holds what every part of actionbus shares with its users:
// the stable error codes that travel in events and the Go error type that
// carries them.
//
// It is not the runtime: the services live under internal/, and the public
// Go API for users is in the client, executor and actionbustest packages.
//
// Errors are matched by code, never by message:
//
//	if errors.Is(err, actionbus.ErrActionNotFound) { ... }
//	var abErr *actionbus.Error
//	if errors.As(err, &abErr) { log.Print(abErr.Code) }
package actionbus

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable snake_case error code. Codes appear in
// events (the "code" field of every error object) and in [Error]. They never
// change meaning once published; new failures get new codes.
type Code string

// The error codes. The list is the single source for events, the Go API and
// docs/events.md.
const (
	CodeInternal             Code = "internal"
	CodeActionNotFound       Code = "action_not_found"
	CodeActionAlreadyExists  Code = "action_already_registered"
	CodeSchemaValidation     Code = "schema_validation"
	CodeModeNotAllowed       Code = "mode_not_allowed"
	CodePolicyRejected       Code = "policy_rejected"
	CodeApprovalRequired     Code = "approval_required"
	CodeTimeout              Code = "timeout"
	CodeDeliveryExhausted    Code = "delivery_exhausted"
	CodeCanceled             Code = "canceled"
	CodeHandlerFailed        Code = "handler_failed"
	CodeInvalidDecision      Code = "invalid_decision"
	CodePlanRejected         Code = "plan_rejected"
	CodeMaxCycles            Code = "max_cycles_exceeded"
	CodeRunDeadline          Code = "run_deadline_exceeded"
	CodeCatalogConflict      Code = "catalog_conflict"
	CodeCatalogUnavailable   Code = "catalog_unavailable"
	CodeMalformedEvent       Code = "malformed_event"
	CodeUnknownEventType     Code = "unknown_event_type"
	CodeUnsupportedContent   Code = "unsupported_content_type"
	CodeEventRejected        Code = "event_rejected"
	CodeInvalidStepReference Code = "invalid_step_reference"
	CodeDuplicateStep        Code = "duplicate_step"
	CodeWorkflowValidation   Code = "workflow_validation"
	CodeWorkflowAborted      Code = "workflow_aborted"
	CodeScenarioNotFound     Code = "scenario_not_found"
	// CodeScenarioFailed: a script-planner scenario's template could not
	// be rendered for this run (an index past the end of a list, a
	// missing result, a forEach that is not a list); the message and
	// details name the scenario, the cycle, the field, its line in the
	// scenario file and the template.
	CodeScenarioFailed       Code = "scenario_failed"
	CodeMissingTopology      Code = "missing_topology"
	CodeActionArgsInvalid    Code = "action_args_invalid"
	CodeInvalidAuditPolicy   Code = "invalid_audit_policy"
	CodeInvalidDefinition    Code = "invalid_definition"
	CodeWorkflowExecution    Code = "workflow_execution"
	CodePlannerFailed        Code = "planner_failed"
	CodeProviderError        Code = "provider_error"
	CodeNativeToolCallsEmpty Code = "native_tool_calls_empty"
	CodeToolsUnsupported     Code = "tools_unsupported"
	CodePlannerRepaired      Code = "planner_repaired"
	CodeReplayDiverged       Code = "replay_diverged"
	CodeWorkspacePath        Code = "workspace_path_refused"
	CodeStaleFile            Code = "stale_file"
	CodePatchRejected        Code = "patch_rejected"
	CodeSQLRefused           Code = "sql_refused"
	CodeSQLLimit             Code = "sql_limit_exceeded"
	CodeStageStalled         Code = "stage_stalled"
	CodeRepeatedFailure      Code = "repeated_failure"
	CodeApprovalDenied       Code = "approval_denied"
	CodeApprovalExpired      Code = "approval_expired"
	CodeApprovalInvalid      Code = "approval_invalid"
	CodeApprovalReplayed     Code = "approval_replayed"
	CodeSubjectMismatch      Code = "subject_mismatch"
	CodeInvalidRunID         Code = "invalid_run_id"
	CodeIdempotencyConflict  Code = "idempotency_key_conflict"
	CodePayloadTooLarge      Code = "payload_too_large"
	CodeRunEnded             Code = "run_ended"
	CodeArtifactMismatch     Code = "artifact_mismatch"
	CodeRetryRefused         Code = "retry_refused"
	CodeInvalidTenant        Code = "invalid_tenant"
	CodeTenantNotServed      Code = "tenant_not_served"
	CodeSkillNotFound        Code = "skill_not_found"
	CodeSkillNotActive       Code = "skill_not_active"
	CodeSkillToolRefused     Code = "skill_tool_refused"
	CodeHandoffRefused       Code = "handoff_refused"
	CodeHandoffCycle         Code = "agent_handoff_cycle_detected"
	CodeInvalidSkill         Code = "invalid_skill"
	CodeShellRefused         Code = "shell_command_refused"
	CodeShellExit            Code = "shell_exit_nonzero"
	CodeShellLimit           Code = "shell_limit_exceeded"
	CodeIsolationUnavailable Code = "isolation_unavailable"
	CodeMCPToolError         Code = "mcp_tool_error"
	CodeMCPUnavailable       Code = "mcp_server_unavailable"
	CodeUnauthenticated      Code = "unauthenticated"
	CodeForbidden            Code = "forbidden"
	CodeRunNotFound          Code = "run_not_found"
	CodeApprovalNotFound     Code = "approval_not_found"
	CodeBadRequest           Code = "bad_request"
	CodeAccountRefused       Code = "account_refused"
	// CodeArtifactNotFound: no artifact of the asking tenant has this
	// reference (missing, and another tenant's, are the same answer).
	CodeArtifactNotFound Code = "artifact_not_found"
	// CodeRegistrarUnavailable: an executor's announcement of its actions
	// got no answer from a registrar before its deadline.
	CodeRegistrarUnavailable Code = "registrar_unavailable"
	// CodeCatalogLimit: an announcement over one of the registrar's
	// bounds (entries per pool, bytes per announcement or per entry); the
	// details name the limit. Nothing of it is recorded.
	CodeCatalogLimit Code = "catalog_limit_exceeded"
	// CodeBudgetExceeded: a run's LLM calls went over its budget (tokens
	// or cost), a call would have, or a run asked for more budget than
	// the host grants; the details name the budget and the usage so far.
	CodeBudgetExceeded Code = "budget_exceeded"
	// CodeInvalidRecord: a record a trusted service read from a bucket (a
	// catalog entry, an idempotency record, a presence value) fails its
	// schema in schemas/ or its hash; it is refused (not listed, not
	// used) and logged once. The details name the record kind and key.
	CodeInvalidRecord Code = "invalid_record"
	// CodeTopologyBusy: provisioning would remove a consumer that still
	// holds events (a dispatcher consumer of a partition that would no
	// longer exist, or of the layout before partitions); nothing was
	// changed. The details name the consumer and its events.
	CodeTopologyBusy Code = "topology_busy"
)

// Codes lists every defined code, in declaration order.
var Codes = []Code{
	CodeInternal, CodeActionNotFound, CodeActionAlreadyExists, CodeSchemaValidation,
	CodeModeNotAllowed, CodePolicyRejected, CodeApprovalRequired, CodeTimeout,
	CodeDeliveryExhausted, CodeCanceled, CodeHandlerFailed, CodeInvalidDecision,
	CodePlanRejected, CodeMaxCycles, CodeRunDeadline, CodeCatalogConflict, CodeCatalogUnavailable,
	CodeMalformedEvent, CodeUnknownEventType, CodeUnsupportedContent, CodeEventRejected,
	CodeInvalidStepReference, CodeDuplicateStep, CodeWorkflowValidation, CodeWorkflowAborted,
	CodeScenarioNotFound, CodeScenarioFailed, CodeMissingTopology, CodeActionArgsInvalid, CodeInvalidAuditPolicy,
	CodeInvalidDefinition, CodeWorkflowExecution, CodePlannerFailed, CodeStageStalled, CodeRepeatedFailure,
	CodeApprovalDenied, CodeApprovalExpired, CodeApprovalInvalid, CodeApprovalReplayed,
	CodeProviderError, CodeNativeToolCallsEmpty, CodeToolsUnsupported, CodePlannerRepaired,
	CodeReplayDiverged, CodeWorkspacePath, CodeStaleFile, CodePatchRejected, CodeSQLRefused, CodeSQLLimit,
	CodeSubjectMismatch, CodeInvalidRunID, CodeIdempotencyConflict, CodePayloadTooLarge, CodeRunEnded,
	CodeArtifactMismatch, CodeRetryRefused, CodeInvalidTenant, CodeTenantNotServed,
	CodeSkillNotFound, CodeSkillNotActive, CodeSkillToolRefused, CodeHandoffRefused, CodeHandoffCycle, CodeInvalidSkill,
	CodeShellRefused, CodeShellExit, CodeShellLimit, CodeIsolationUnavailable, CodeMCPToolError, CodeMCPUnavailable,
	CodeUnauthenticated, CodeForbidden, CodeRunNotFound, CodeApprovalNotFound, CodeBadRequest,
	CodeAccountRefused,
	CodeArtifactNotFound, CodeRegistrarUnavailable, CodeCatalogLimit, CodeBudgetExceeded,
	CodeInvalidRecord, CodeTopologyBusy,
}

// Sentinel errors, one per code, for errors.Is. Any *Error with the same code
// matches its sentinel regardless of message or details.
var (
	ErrActionNotFound      = &Error{Code: CodeActionNotFound}
	ErrCatalogConflict     = &Error{Code: CodeCatalogConflict}
	ErrActionExists        = &Error{Code: CodeActionAlreadyExists}
	ErrSchemaValidation    = &Error{Code: CodeSchemaValidation}
	ErrModeNotAllowed      = &Error{Code: CodeModeNotAllowed}
	ErrPolicyRejected      = &Error{Code: CodePolicyRejected}
	ErrApprovalRequired    = &Error{Code: CodeApprovalRequired}
	ErrTimeout             = &Error{Code: CodeTimeout}
	ErrDeliveryExhausted   = &Error{Code: CodeDeliveryExhausted}
	ErrCanceled            = &Error{Code: CodeCanceled}
	ErrMalformedEvent      = &Error{Code: CodeMalformedEvent}
	ErrUnknownEventType    = &Error{Code: CodeUnknownEventType}
	ErrUnsupportedData     = &Error{Code: CodeUnsupportedContent}
	ErrMissingTopology     = &Error{Code: CodeMissingTopology}
	ErrArgsInvalid         = &Error{Code: CodeActionArgsInvalid}
	ErrInvalidDefinition   = &Error{Code: CodeInvalidDefinition}
	ErrStageStalled        = &Error{Code: CodeStageStalled}
	ErrRepeatedFailure     = &Error{Code: CodeRepeatedFailure}
	ErrWorkflowValidation  = &Error{Code: CodeWorkflowValidation}
	ErrSubjectMismatch     = &Error{Code: CodeSubjectMismatch}
	ErrInvalidRunID        = &Error{Code: CodeInvalidRunID}
	ErrInvalidTenant       = &Error{Code: CodeInvalidTenant}
	ErrIdempotencyConflict = &Error{Code: CodeIdempotencyConflict}
	ErrPayloadTooLarge     = &Error{Code: CodePayloadTooLarge}
	ErrSkillNotFound       = &Error{Code: CodeSkillNotFound}
	ErrInvalidSkill        = &Error{Code: CodeInvalidSkill}
	ErrArtifactNotFound    = &Error{Code: CodeArtifactNotFound}
	ErrCatalogLimit        = &Error{Code: CodeCatalogLimit}
	ErrBudgetExceeded      = &Error{Code: CodeBudgetExceeded}
	ErrInvalidRecord       = &Error{Code: CodeInvalidRecord}
	ErrTopologyBusy        = &Error{Code: CodeTopologyBusy}
)

// Error is an actionbus failure with a stable code. It is the Go form of the
// error object carried in events ({"code", "message", "details"}).
type Error struct {
	// Code is the stable machine-readable code.
	Code Code `json:"code" msgpack:"code"`
	// Message is a human-readable lower-case description.
	Message string `json:"message,omitempty" msgpack:"message,omitempty"`
	// Details carries structured context (paths, action names, limits).
	Details map[string]any `json:"details,omitempty" msgpack:"details,omitempty"`

	cause error
}

// Errorf returns an *Error with the given code and a formatted message. A %w
// verb in format is kept as the cause for errors.Is/As.
func Errorf(code Code, format string, args ...any) *Error {
	wrapped := fmt.Errorf(format, args...)
	return &Error{Code: code, Message: wrapped.Error(), cause: errors.Unwrap(wrapped)}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Unwrap returns the underlying cause, if any.
func (e *Error) Unwrap() error { return e.cause }

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// WithDetail returns a copy of e with key set to value in Details.
func (e *Error) WithDetail(key string, value any) *Error {
	c := *e
	c.Details = make(map[string]any, len(e.Details)+1)
	for k, v := range e.Details {
		c.Details[k] = v
	}
	c.Details[key] = value
	return &c
}

// CodeOf returns the code of the first *Error in err's chain, or CodeInternal
// when there is none. A nil error has no code ("").
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}
