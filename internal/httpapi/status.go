package httpapi

import (
	"net/http"

	"github.com/actionbus/actionbus"
)

// StatusOf maps an error code to its HTTP status, as seed 002's HTTP
// examples do: not found 404, schema 400, timeout 408, mode, approval and
// policy 403. Codes not named here are 500 (the run's or the service's
// failure, not the request's).
func StatusOf(code actionbus.Code) int {
	switch code {
	case actionbus.CodeActionNotFound, actionbus.CodeRunNotFound, actionbus.CodeApprovalNotFound,
		actionbus.CodeSkillNotFound, actionbus.CodeScenarioNotFound:
		return http.StatusNotFound
	case actionbus.CodeSchemaValidation, actionbus.CodeActionArgsInvalid, actionbus.CodeBadRequest,
		actionbus.CodeInvalidRunID, actionbus.CodeInvalidTenant, actionbus.CodeWorkflowValidation,
		actionbus.CodeInvalidStepReference, actionbus.CodeDuplicateStep:
		return http.StatusBadRequest
	case actionbus.CodeTimeout, actionbus.CodeRunDeadline, actionbus.CodeStageStalled:
		return http.StatusRequestTimeout
	case actionbus.CodeModeNotAllowed, actionbus.CodePolicyRejected, actionbus.CodeApprovalRequired,
		actionbus.CodeApprovalDenied, actionbus.CodeApprovalExpired, actionbus.CodeApprovalInvalid,
		actionbus.CodeApprovalReplayed, actionbus.CodeForbidden, actionbus.CodeTenantNotServed:
		return http.StatusForbidden
	case actionbus.CodeUnauthenticated:
		return http.StatusUnauthorized
	case actionbus.CodeIdempotencyConflict, actionbus.CodeRunEnded, actionbus.CodeRetryRefused, actionbus.CodeCanceled:
		return http.StatusConflict
	case actionbus.CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}
