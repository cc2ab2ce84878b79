package run

// StepName names a progress step (the name of a run.step event). The names
// are the seed's telemetry names; the CLI, the auditor and the docs use
// these constants, and [StepNames] lists them all.
type StepName string

// Progress steps, in alphabetical order.
const (
	StepAct                               StepName = "act"
	StepActionArgsAliasRewrite            StepName = "action-args-alias-rewrite"
	StepActionArgsAutoHeal                StepName = "action-args-auto-heal"
	StepActionArgsInvalid                 StepName = "action-args-invalid"
	StepActionCompleted                   StepName = "action-completed"
	StepActionDispatched                  StepName = "action-dispatched"
	StepActionRedispatched                StepName = "action-redispatched"
	StepActionFailed                      StepName = "action-failed"
	StepActionRepeatedFailure             StepName = "action-repeated-failure"
	StepActionInputUnexpectedKeysStripped StepName = "action.input.unexpected_keys_stripped"
	StepApprovalDenied                    StepName = "approval-denied"
	StepApprovalExpired                   StepName = "approval-expired"
	StepApprovalGranted                   StepName = "approval-granted"
	StepApprovalRefused                   StepName = "approval-refused"
	StepAwaitingApproval                  StepName = "awaiting-approval"
	StepAwaitingInput                     StepName = "awaiting-input"
	StepCanceled                          StepName = "canceled"
	StepDecide                            StepName = "decide"
	StepDecisionInvalid                   StepName = "decision-invalid"
	StepDirectFinalEmitted                StepName = "direct-final-emitted"
	StepDirectFinalSkipped                StepName = "direct-final-skipped"
	StepEvaluate                          StepName = "evaluate"
	StepFinal                             StepName = "final"
	StepInputIgnored                      StepName = "input-ignored"
	StepInputReceived                     StepName = "input-received"
	StepObserve                           StepName = "observe"
	StepOrient                            StepName = "orient"
	StepPlanExecuted                      StepName = "plan-executed"
	StepPlanExecuting                     StepName = "plan-executing"
	StepPlanFailed                        StepName = "plan-failed"
	StepPlanSynthesizeRequested           StepName = "plan-synthesize-requested"
	StepPlanValidating                    StepName = "plan-validating"
	StepPlanValidationFailed              StepName = "plan-validation-failed"
	StepPlannerDiagnostics                StepName = "planner-diagnostics"
	StepPolicyEvaluated                   StepName = "policy-evaluated"
	StepStageStalled                      StepName = "stage-stalled"
	StepSynthesizeIntroDone               StepName = "synthesize-intro-done"
	StepSynthesizeOutroDone               StepName = "synthesize-outro-done"
	StepSynthesizePerActionStart          StepName = "synthesize-per-action-start"
	StepSynthesizeSectionDone             StepName = "synthesize-section-done"
	StepSynthesizeStitchDone              StepName = "synthesize-stitch-done"
	StepWorkflowAborted                   StepName = "workflow-aborted"
	StepWorkflowCompleted                 StepName = "workflow-completed"
	StepWorkflowStepContinued             StepName = "workflow-step-continued"
	StepWorkflowStepReused                StepName = "workflow-step-reused"
	StepWorkflowStepRetry                 StepName = "workflow-step-retry"
	StepWorkflowValidated                 StepName = "workflow-validated"
	StepWaitingForCapacity                StepName = "waiting-for-capacity"
	StepRetried                           StepName = "retried"
	StepRetryResumed                      StepName = "retry-resumed"
)

// progressSteps are the steps published as run.progress: live on core
// NATS for followers, never stored or audited. Recovery does not need
// them (the run state holds where the run is) and they say nothing the
// stored events do not: a dispatch is the work item, a completion the
// result, the end the terminal event.
var progressSteps = map[StepName]bool{
	StepAct: true, StepActionDispatched: true, StepActionCompleted: true, StepDecide: true, StepEvaluate: true,
	StepFinal: true, StepObserve: true, StepOrient: true, StepPlanExecuted: true, StepPlanExecuting: true,
	StepPlanValidating: true, StepPlanSynthesizeRequested: true, StepSynthesizeIntroDone: true,
	StepSynthesizeOutroDone: true, StepSynthesizePerActionStart: true, StepSynthesizeSectionDone: true,
	StepSynthesizeStitchDone: true, StepWorkflowValidated: true, StepWorkflowCompleted: true, StepDirectFinalEmitted: true,
}

// Recorded reports whether the step is stored and audited (a run.step
// event): what an operator must find later — policy decisions, approvals,
// waits, refusals, failures, retries, rewritten model input. Every other
// step is progress (a run.progress event, live only).
func (n StepName) Recorded() bool { return !progressSteps[n] }

// StepNames lists every step a run publishes.
var StepNames = []StepName{
	StepAct,
	StepActionArgsAliasRewrite,
	StepActionArgsAutoHeal,
	StepActionArgsInvalid,
	StepActionCompleted,
	StepActionDispatched,
	StepActionRedispatched,
	StepActionFailed,
	StepActionRepeatedFailure,
	StepActionInputUnexpectedKeysStripped,
	StepApprovalDenied,
	StepApprovalExpired,
	StepApprovalGranted,
	StepApprovalRefused,
	StepAwaitingApproval,
	StepAwaitingInput,
	StepCanceled,
	StepDecide,
	StepDecisionInvalid,
	StepDirectFinalEmitted,
	StepDirectFinalSkipped,
	StepEvaluate,
	StepFinal,
	StepInputIgnored,
	StepInputReceived,
	StepObserve,
	StepOrient,
	StepPlanExecuted,
	StepPlanExecuting,
	StepPlanFailed,
	StepPlanSynthesizeRequested,
	StepPlanValidating,
	StepPlanValidationFailed,
	StepPlannerDiagnostics,
	StepPolicyEvaluated,
	StepStageStalled,
	StepSynthesizeIntroDone,
	StepSynthesizeOutroDone,
	StepSynthesizePerActionStart,
	StepSynthesizeSectionDone,
	StepSynthesizeStitchDone,
	StepWorkflowAborted,
	StepWorkflowCompleted,
	StepWorkflowStepContinued,
	StepWorkflowStepRetry,
	StepWorkflowStepReused,
	StepWorkflowValidated,
	StepWaitingForCapacity,
	StepRetried,
	StepRetryResumed,
}
