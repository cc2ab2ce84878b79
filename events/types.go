package events

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/actionbus/actionbus"
)

// Event types. Every type is io.actionbus.<noun>.<verb>.
const (
	TypeRunRequested       = "io.actionbus.run.requested"
	TypeRunStarted         = "io.actionbus.run.started"
	TypeRunStep            = "io.actionbus.run.step"
	TypeRunProgress        = "io.actionbus.run.progress"
	TypeRunCompleted       = "io.actionbus.run.completed"
	TypeRunFailed          = "io.actionbus.run.failed"
	TypeRunCanceled        = "io.actionbus.run.canceled"
	TypeCancelRequested    = "io.actionbus.cancel.requested"
	TypeDecisionRequested  = "io.actionbus.decision.requested"
	TypeDecisionMade       = "io.actionbus.decision.made"
	TypeActionRequested    = "io.actionbus.action.requested"
	TypeActionCompleted    = "io.actionbus.action.completed"
	TypeActionFailed       = "io.actionbus.action.failed"
	TypeEventRejected      = "io.actionbus.event.rejected"
	TypeAuditRecorded      = "io.actionbus.audit.recorded"
	TypeAuditAppended      = "io.actionbus.audit.appended"
	TypeInputProvided      = "io.actionbus.input.provided"
	TypeTimerFired         = "io.actionbus.timer.fired"
	TypeApprovalRequested  = "io.actionbus.approval.requested"
	TypeApprovalGranted    = "io.actionbus.approval.granted"
	TypeApprovalDenied     = "io.actionbus.approval.denied"
	TypeApprovalResolved   = "io.actionbus.approval.resolved"
	TypeSynthesisRequested = "io.actionbus.synthesis.requested"
	TypeSynthesisCompleted = "io.actionbus.synthesis.completed"
	TypePoolAnnounced      = "io.actionbus.pool.announced"
)

// IsRunStep reports whether eventType carries steps of a run: a recorded
// step (run.step, stored and audited, one step) or progress steps
// (run.progress, live only, a [RunProgress] list of steps).
func IsRunStep(eventType string) bool {
	return eventType == TypeRunStep || eventType == TypeRunProgress
}

// Origins of action input (see the Conventions in docs/architecture.md).
const (
	// OriginModel marks input written by a planner (an LLM or a script):
	// undeclared and host-only keys are stripped before the handler sees it.
	OriginModel = "model"
	// OriginHost marks input written by the host application (workflows,
	// exec): it is trusted as far as its schema allows.
	OriginHost = "host"
)

// Decision types a planner may return.
const (
	DecisionAction  = "action"
	DecisionPlan    = "plan"
	DecisionClarify = "clarify"
	DecisionFinal   = "final"
)

// RunRequested asks the dispatcher to start a run. It is the one event that
// users publish themselves, from any language.
type RunRequested struct {
	// Tenant is the run's tenant; when set it must equal the subject's
	// tenant token (the dispatcher believes the subject).
	Tenant       string         `json:"tenant,omitempty"`
	RunID        string         `json:"runId"`
	Prompt       string         `json:"prompt,omitempty"`
	Scenario     string         `json:"scenario,omitempty"`
	Workflow     map[string]any `json:"workflow,omitempty"`
	UserID       string         `json:"userId,omitempty"`
	AllowedModes []string       `json:"allowedModes,omitempty"`
	Metadata     map[string]any `json:"metadata,omitempty"`
	// DeadlineMs bounds the whole run; 0 means the dispatcher's default.
	DeadlineMs int64 `json:"deadlineMs,omitempty"`
	// Action makes the run a one-action host-origin run (actionbus exec):
	// no planner is asked; the run ends with the action's result.
	Action *ActionCall `json:"action,omitempty"`
	// Replay makes the run a replay of a recorded run: the planner answers
	// cycle N with the recorded decision N instead of asking its provider.
	Replay *Replay `json:"replay,omitempty"`
	// RetryOf makes the run a retry of a failed or canceled workflow run
	// (actionbus retry): the steps that run completed are reused, not run
	// again, and the workflow resumes at the step that failed.
	RetryOf string `json:"retryOf,omitempty"`
	// Workspace gives an agent run a virtual workspace holding these
	// documents (path → markdown), which the workspace actions read,
	// grow, patch and publish.
	Workspace map[string]string `json:"workspace,omitempty"`
	// Principal is the user a gateway (the HTTP API, the MCP server)
	// authenticated, signed with the gateway's key: the run holds its
	// roles and scopes. Without it the run holds what the policy grants
	// the tenant's NATS clients.
	Principal *Principal `json:"principal,omitempty"`
	// Budget bounds what the run may spend on LLM calls. The host's run
	// budget (the dispatcher's configuration) caps it: a request for more
	// than the cap is refused (budget_exceeded), never granted.
	Budget *Budget `json:"budget,omitempty"`
}

// Principal is a gateway's signed statement of the user it authenticated
// (docs/approvals.md, "Roles and scopes").
type Principal struct {
	User   string   `json:"user"`
	Roles  []string `json:"roles,omitempty"`
	Scopes []string `json:"scopes,omitempty"`
	// ExpiresAt bounds the statement (RFC 3339, UTC, whole seconds).
	ExpiresAt time.Time `json:"expiresAt"`
	Token     string    `json:"token"`
}

// Replay is a recorded run's decisions, fed back to the planner by
// actionbus replay.
type Replay struct {
	// RunID is the recorded run.
	RunID string `json:"runId"`
	// Decisions are the recorded decisions, one per cycle.
	Decisions []Decision `json:"decisions"`
}

// ActionCall names an action and its input.
type ActionCall struct {
	Name           string         `json:"name"`
	Args           map[string]any `json:"args,omitempty"`
	IdempotencyKey string         `json:"idempotencyKey,omitempty"`
}

// RunStarted records that the dispatcher accepted a run.
type RunStarted struct {
	RunID    string `json:"runId"`
	Kind     string `json:"kind"`
	Prompt   string `json:"prompt,omitempty"`
	Scenario string `json:"scenario,omitempty"`
	// RetryOf is the run this one retries.
	RetryOf string `json:"retryOf,omitempty"`
}

// RunStep is one progress step of a run, named with the telemetry step names
// (observe, decide, plan-executing, action-started, ...).
type RunStep struct {
	RunID     string `json:"runId"`
	Name      string `json:"name"`
	Cycle     int    `json:"cycle"`
	PlanIndex *int   `json:"planIndex,omitempty"`
	Action    string `json:"action,omitempty"`
	Message   string `json:"message,omitempty"`
	Status    string `json:"status,omitempty"`
	// Details holds structured facts of the step.
	Details map[string]any `json:"details,omitempty"`
}

// ProgressVersion is the version of [RunProgress] data: 2, a list of
// steps (version 1, which no field named, was one step, the shape of
// run.step data). A reader that finds another version (or no steps) is
// reading a format it does not know.
const ProgressVersion = 2

// RunProgress is the data of a run.progress event: the live steps of one
// transition, in the order the run took them, each the shape of run.step
// data (the seed's step names unchanged), so that a transition's progress
// crosses the server as one message.
type RunProgress struct {
	// Version is [ProgressVersion].
	Version int    `json:"version"`
	RunID   string `json:"runId"`
	// Steps holds at least one step; each step's RunID is the event's.
	Steps []RunStep `json:"steps"`
}

// RunCompleted is the terminal event of a successful run.
type RunCompleted struct {
	RunID     string   `json:"runId"`
	Answer    string   `json:"answer,omitempty"`
	Output    any      `json:"output,omitempty"`
	Citations []string `json:"citations,omitempty"`
	Cycles    int      `json:"cycles"`
	// Usage is what the run's LLM calls used; absent when it made none.
	Usage *RunUsage `json:"usage,omitempty"`
}

// RunFailed is the terminal event of a failed run.
type RunFailed struct {
	RunID  string          `json:"runId"`
	Error  actionbus.Error `json:"error"`
	Cycles int             `json:"cycles"`
	Usage  *RunUsage       `json:"usage,omitempty"`
}

// RunCanceled is the terminal event of a canceled run.
type RunCanceled struct {
	RunID  string    `json:"runId"`
	Reason string    `json:"reason,omitempty"`
	Cycles int       `json:"cycles"`
	Usage  *RunUsage `json:"usage,omitempty"`
}

// CancelRequested asks the dispatcher to cancel a run.
type CancelRequested struct {
	RunID       string `json:"runId"`
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

// Observation is what the planner sees of one executed action.
type Observation struct {
	Cycle     int              `json:"cycle"`
	PlanIndex *int             `json:"planIndex,omitempty"`
	Action    string           `json:"action"`
	OK        bool             `json:"ok"`
	Output    any              `json:"output,omitempty"`
	Summary   string           `json:"summary,omitempty"`
	Error     *actionbus.Error `json:"error,omitempty"`
}

// DecisionRequested asks a planner for the next decision of a run.
type DecisionRequested struct {
	RunID        string        `json:"runId"`
	Cycle        int           `json:"cycle"`
	Prompt       string        `json:"prompt,omitempty"`
	Scenario     string        `json:"scenario,omitempty"`
	Observations []Observation `json:"observations"`
	// Feedback explains why the previous decision was rejected, so the
	// planner can correct itself.
	Feedback *actionbus.Error `json:"feedback,omitempty"`
	// Synthesize is the plan's synthesize_instruction when the previous
	// cycle ran a plan that asked for synthesis: the planner should answer
	// with a final built from the observations.
	Synthesize string `json:"synthesize,omitempty"`
	// Replay is set for replay runs: the planner answers from it.
	Replay *Replay `json:"replay,omitempty"`
	// Skill is the run's active skill (the seed's activeAgentSkill and
	// agentSkillContext): its instructions and tools shape the decision.
	Skill *SkillContext `json:"skill,omitempty"`
	// Workspace summarizes the run's virtual workspace (nil when it has
	// none): the workspace actions are offered with it.
	Workspace *WorkspaceView `json:"workspace,omitempty"`
	// Hidden are actions withheld from this decision's surface (after a
	// blocked patch preview: propose and apply, so the planner grows the
	// document instead of repeating the preview).
	Hidden []string `json:"hidden,omitempty"`
	// Budget is the run's budget and Used what the run has used so far:
	// the planner makes no call its estimate says would go over.
	Budget *Budget   `json:"budget,omitempty"`
	Used   *RunUsage `json:"used,omitempty"`
	// TenantBudget is the run's tenant's budget per UTC day, shared by
	// every run and planner of the tenant: the planners keep the day's
	// spend in their limits bucket and make no call that would go over.
	TenantBudget *Budget `json:"tenantBudget,omitempty"`
}

// WorkspaceView is a run's virtual workspace as the planner sees it: its
// files' versions and text statistics, and the pending patch's state.
type WorkspaceView struct {
	Version int                 `json:"version"`
	Files   []WorkspaceFileView `json:"files"`
	// PendingPatch is the latest proposal: {patchId, status, riskFlags}.
	PendingPatch map[string]any `json:"pendingPatch,omitempty"`
}

// WorkspaceFileView is one workspace file's version and statistics.
type WorkspaceFileView struct {
	Path     string `json:"path"`
	Version  int    `json:"version"`
	Words    int    `json:"words"`
	Headings int    `json:"headings"`
}

// SkillContext is the active skill as the planner sees it.
type SkillContext struct {
	Name         string      `json:"name"`
	Description  string      `json:"description,omitempty"`
	Version      string      `json:"version,omitempty"`
	Instructions string      `json:"instructions,omitempty"`
	Tools        []SkillTool `json:"tools,omitempty"`
	// Handoffs are the skills handoff_to_skill may move to.
	Handoffs []string `json:"handoffs,omitempty"`
	// HandoffChain and HandoffContext are the run's handoffs so far.
	HandoffChain   []string `json:"handoffChain,omitempty"`
	HandoffContext string   `json:"handoffContext,omitempty"`
}

// SkillTool is one tool of the active skill: execute_skill_tool runs it.
type SkillTool struct {
	Name        string         `json:"name"`
	Description string         `json:"description,omitempty"`
	Parameters  map[string]any `json:"parameters,omitempty"`
	ResultKind  string         `json:"resultKind,omitempty"`
}

// InputProvided answers a run's clarify question and resumes it.
type InputProvided struct {
	RunID      string `json:"runId"`
	Answer     string `json:"answer"`
	ProvidedBy string `json:"providedBy,omitempty"`
}

// Timer kinds.
const (
	TimerRunDeadline = "run_deadline"
	TimerDecision    = "decision"
	TimerAction      = "action"
	TimerInput       = "input"
	TimerApproval    = "approval"
	TimerRetry       = "retry"
	TimerSynthesis   = "synthesis"
	// TimerCapacity wakes a run whose calls wait for capacity.
	TimerCapacity = "capacity"
	// TimerAlarm is a run's one armed schedule: it comes due at the
	// earliest of the run's pending timers, which it fires.
	TimerAlarm = "alarm"
)

// TimerFired is a durable timer of a run coming due. The dispatcher
// publishes it as a JetStream message schedule whose target is the run's
// timer subject, so it fires even if every service restarted meanwhile.
type TimerFired struct {
	RunID string `json:"runId"`
	Kind  string `json:"kind"`
	Cycle int    `json:"cycle"`
	// CallID names the call of an action timer, ApprovalID the approval
	// of an approval timer, StepID the workflow step of a retry timer.
	CallID     string    `json:"callId,omitempty"`
	ApprovalID string    `json:"approvalId,omitempty"`
	StepID     string    `json:"stepId,omitempty"`
	Stage      string    `json:"stage"`
	DueAt      time.Time `json:"dueAt"`
}

// Decision is one planner envelope: action, plan, clarify or final.
type Decision struct {
	Type string `json:"type"`
	// IdempotencyKey is set by hosts (exec, workflows), never taken from
	// a planner.
	IdempotencyKey        string         `json:"-"`
	Name                  string         `json:"name,omitempty"`
	Args                  map[string]any `json:"args,omitempty"`
	Reasoning             string         `json:"reasoning,omitempty"`
	Actions               []Decision     `json:"actions,omitempty"`
	PartialOK             bool           `json:"partial_ok,omitempty"`
	SynthesizeInstruction string         `json:"synthesize_instruction,omitempty"`
	Question              string         `json:"question,omitempty"`
	Answer                string         `json:"answer,omitempty"`
	Citations             []string       `json:"citations,omitempty"`
	// SynthesizePerAction asks for one synthesis call per plan action,
	// stitched into the final answer by the dispatcher.
	SynthesizePerAction bool `json:"synthesize_per_action,omitempty"`
	// Section is a plan action's section of a per-action synthesis.
	Section *Section `json:"section,omitempty"`
	// Stitch configures how per-action sections are put together.
	Stitch *Stitch `json:"stitch,omitempty"`
}

// Section is one plan action's part of a per-action synthesis.
type Section struct {
	// Title is the section heading; default "## Section N".
	Title string `json:"title,omitempty"`
	// Prompt tells the synthesis call how to write the section. Required
	// when the plan synthesizes per action.
	Prompt string `json:"prompt"`
}

// Stitch configures the deterministic stitching of a per-action synthesis.
type Stitch struct {
	IntroPrompt string      `json:"intro_prompt,omitempty"`
	OutroPrompt string      `json:"outro_prompt,omitempty"`
	Provenance  string      `json:"provenance,omitempty"`
	Followups   []string    `json:"followups,omitempty"`
	DrillHints  []DrillHint `json:"drill_hints,omitempty"`
}

// DrillHint is one UI drill-down hint appended to a stitched answer.
type DrillHint struct {
	MatchHeader string `json:"match_header"`
	Label       string `json:"label"`
	Prompt      string `json:"prompt"`
}

// Synthesis parts.
const (
	PartSection = "section"
	PartIntro   = "intro"
	PartOutro   = "outro"
)

// SynthesisRequested asks a planner for one part of a per-action
// synthesis: a section from one action's result, or the intro or outro
// from compact summaries of every result.
type SynthesisRequested struct {
	RunID string `json:"runId"`
	Cycle int    `json:"cycle"`
	// Part is "section", "intro" or "outro".
	Part string `json:"part"`
	// Index is the plan index of a section's action; 0 otherwise.
	Index int `json:"index"`
	// Prompt is the run's original request.
	Prompt string `json:"prompt,omitempty"`
	// Instruction is the section prompt, or the stitch intro/outro prompt.
	Instruction string `json:"instruction"`
	// Results are the section's action result, or every result in compact
	// form for the intro and outro.
	Results  []Observation `json:"results"`
	Scenario string        `json:"scenario,omitempty"`
	// Budget, Used and TenantBudget as on DecisionRequested (sections in
	// flight at once each see the usage before any of them).
	Budget       *Budget   `json:"budget,omitempty"`
	Used         *RunUsage `json:"used,omitempty"`
	TenantBudget *Budget   `json:"tenantBudget,omitempty"`
}

// SynthesisCompleted answers a SynthesisRequested with markdown, or with
// the error that made the part fail (the section then renders as a
// "section failed" comment; the run continues).
type SynthesisCompleted struct {
	RunID    string           `json:"runId"`
	Cycle    int              `json:"cycle"`
	Part     string           `json:"part"`
	Index    int              `json:"index"`
	Markdown string           `json:"markdown,omitempty"`
	Error    *actionbus.Error `json:"error,omitempty"`
	// Usage is what the part's LLM calls used.
	Usage []LLMUsage `json:"usage,omitempty"`
}

// DecisionMade carries a planner's decision for one cycle.
type DecisionMade struct {
	RunID    string   `json:"runId"`
	Cycle    int      `json:"cycle"`
	Decision Decision `json:"decision"`
	Planner  string   `json:"planner,omitempty"`
	// Error is set, instead of a usable decision, when the planner could
	// not decide (unknown scenario, provider failure). It fails the run.
	Error *actionbus.Error `json:"error,omitempty"`
	// Diagnostics are planning evidence recorded on the way to the
	// decision (a reply that was repaired or sent back), not executed work.
	Diagnostics []actionbus.Error `json:"diagnostics,omitempty"`
	// Usage is what the decision's LLM calls used, one entry per call (a
	// corrective round is a second call).
	Usage []LLMUsage `json:"usage,omitempty"`
}

// ActionRequested asks an executor of a pool to run one action call.
type ActionRequested struct {
	RunID string `json:"runId"`
	// Tenant is the run's tenant (work subjects carry no tenant token).
	Tenant    string         `json:"tenant,omitempty"`
	CallID    string         `json:"callId"`
	Cycle     int            `json:"cycle"`
	PlanIndex int            `json:"planIndex"`
	Attempt   int            `json:"attempt"`
	Action    string         `json:"action"`
	Args      map[string]any `json:"args"`
	Origin    string         `json:"origin"`
	UserID    string         `json:"userId,omitempty"`
	TimeoutMs int64          `json:"timeoutMs,omitempty"`
	// IdempotencyKey makes a retried or redelivered call return the first
	// result instead of running the handler again.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// Approval is the verified approval of the call, for handlers that
	// re-check at the mutation point.
	Approval *ApprovalGrant `json:"approval,omitempty"`
	// StepID is the workflow step of the call; MaxAttempts its retry
	// policy's attempts (the first included).
	StepID      string `json:"stepId,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
	// Policy is the policy evaluation that admitted the call (its
	// snapshot), recorded by the auditor on the call's record.
	Policy any `json:"policy,omitempty"`
}

// ApprovalContext is what an approval is bound to (see internal/policy).
type ApprovalContext struct {
	ApprovalID  string   `json:"approvalId"`
	RunID       string   `json:"runId"`
	StepID      string   `json:"stepId"`
	UserID      string   `json:"userId"`
	Action      string   `json:"action"`
	InputHash   string   `json:"inputHash"`
	ResourceIDs []string `json:"resourceIds,omitempty"`
	DryRunHash  string   `json:"dryRunHash,omitempty"`
	// DryRunAction is the action whose dry run DryRunHash names.
	DryRunAction string `json:"dryRunAction,omitempty"`
	// DryRunMatches says whether the input to approve, without its
	// dryRunHash key, is the input of one of the run's successful dry
	// runs; DryRunHash and DryRunAction are set only when it is.
	DryRunMatches bool      `json:"dryRunMatches"`
	ExpiresAt     time.Time `json:"expiresAt"`
}

// ApprovalGrant is a verified approval as the executor receives it.
type ApprovalGrant struct {
	Context  ApprovalContext `json:"context"`
	Token    string          `json:"token"`
	Approver string          `json:"approver,omitempty"`
}

// ApprovalRequested asks an approver to approve or deny one action call.
type ApprovalRequested struct {
	RunID   string          `json:"runId"`
	Context ApprovalContext `json:"context"`
	// Input is the call's input, as it will run, for the approver to read.
	Input map[string]any `json:"input"`
	// Policy is the evaluation that asked for approval.
	Reason string `json:"reason,omitempty"`
}

// ApprovalGranted answers an approval with a token signed over its context.
type ApprovalGranted struct {
	RunID      string `json:"runId"`
	ApprovalID string `json:"approvalId"`
	Token      string `json:"token"`
	Approver   string `json:"approver,omitempty"`
	// Context, optional, is the approval context the token signs, as the
	// approver read it. It is never trusted (the token must sign the
	// stored context); it lets a refusal tell a bad signature (a wrong
	// secret) from a token signed over another context.
	Context *ApprovalContext `json:"context,omitempty"`
}

// ApprovalDenied refuses an approval.
type ApprovalDenied struct {
	RunID      string `json:"runId"`
	ApprovalID string `json:"approvalId"`
	// Token authenticates the approver who denies (docs/approvals.md):
	// a denial without a valid one is refused.
	Token    string `json:"token,omitempty"`
	Approver string `json:"approver,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// Approval outcomes of [ApprovalResolved].
const (
	ApprovalOutcomeGranted = "granted"
	ApprovalOutcomeDenied  = "denied"
	ApprovalOutcomeRefused = "refused"
)

// ApprovalResolved is the dispatcher's answer to a grant or a denial: what
// it did with answer AnswerID. It travels on the approval subject, so an
// approver who may read approval requests reads the answers too, and an
// approver's tool can report a refusal instead of assuming success.
type ApprovalResolved struct {
	RunID      string `json:"runId"`
	ApprovalID string `json:"approvalId"`
	// AnswerID is the event id of the grant or denial answered.
	AnswerID string `json:"answerId"`
	// Outcome is granted, denied or refused.
	Outcome  string `json:"outcome"`
	Approver string `json:"approver,omitempty"`
	// Error says why a grant was refused (approval_invalid,
	// approval_replayed, approval_expired).
	Error *actionbus.Error `json:"error,omitempty"`
}

// ArtifactRef points at a large output stored in the artifact object store.
type ArtifactRef struct {
	ID          string `json:"id"`
	Role        string `json:"role"`
	MediaType   string `json:"mediaType"`
	Bytes       int64  `json:"bytes"`
	PreviewSize int    `json:"previewSize"`
	SHA256      string `json:"sha256"`
	Truncated   bool   `json:"truncated"`
	Preview     string `json:"preview,omitempty"`
	// Store is the object store that holds the artifact: the writing
	// pool's ("<prefix>_artifacts_<pool>") or the services'
	// ("<prefix>_artifacts"); "" (references written before stores
	// were per pool) means the services' store.
	Store string `json:"store,omitempty"`
}

// NewArtifactRef is the reference to data stored under id in the object
// store named store: its size and SHA-256, and with previewBytes > 0 a
// preview of at most that many bytes, cut at a UTF-8 boundary. It stores
// nothing: the run core computes the references of the artifacts it asks
// the dispatcher to store, and readers that rebuild a transition compute
// the references its writer stored.
func NewArtifactRef(store, id, role, mediaType string, data []byte, previewBytes int) ArtifactRef {
	sum := sha256.Sum256(data)
	ref := ArtifactRef{ID: id, Role: role, MediaType: mediaType, Bytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Store: store}
	if previewBytes <= 0 {
		return ref
	}
	preview := data
	if len(preview) > previewBytes {
		preview = preview[:previewBytes]
		for len(preview) > 0 && !utf8.Valid(preview) {
			preview = preview[:len(preview)-1]
		}
	}
	ref.PreviewSize, ref.Preview, ref.Truncated = len(preview), string(preview), len(preview) < len(data)
	return ref
}

// PoolAnnounced is an executor's announcement of what it hosts for its
// pool: a request to the registrar, which answers with an
// [AnnounceReply]. The pool that counts is the subject's token.
type PoolAnnounced struct {
	Executor string `json:"executor"`
	Pool     string `json:"pool"`
	// Actions and Skills are the entries as JSON objects (decoded
	// strictly, and validated, by the registrar).
	Actions []map[string]any `json:"actions,omitempty"`
	Skills  []map[string]any `json:"skills,omitempty"`
	// Removed names actions the executor announced before and hosts no
	// more (a mounted MCP server's tool list changed).
	Removed []string `json:"removed,omitempty"`
}

// AnnounceReply is the registrar's answer to a [PoolAnnounced]: the
// names recorded, or the error that refused the announcement (nothing of
// a refused announcement is recorded).
type AnnounceReply struct {
	Actions []string         `json:"actions,omitempty"`
	Skills  []string         `json:"skills,omitempty"`
	Error   *actionbus.Error `json:"error,omitempty"`
}

// ActionCompleted is the successful result of one action call.
type ActionCompleted struct {
	RunID      string `json:"runId"`
	CallID     string `json:"callId"`
	Cycle      int    `json:"cycle"`
	PlanIndex  int    `json:"planIndex"`
	Attempt    int    `json:"attempt"`
	Action     string `json:"action"`
	Output     any    `json:"output,omitempty"`
	Summary    string `json:"summary,omitempty"`
	Complete   bool   `json:"complete,omitempty"`
	DurationMs int64  `json:"durationMs"`
	Executor   string `json:"executor,omitempty"`
	// Deliveries is how many times JetStream delivered the request.
	Deliveries int `json:"deliveries,omitempty"`
	// Replayed is true when the result is the stored result of an earlier
	// execution with the same idempotency key (the handler did not run).
	Replayed bool `json:"replayed,omitempty"`
	// Artifacts reference outputs too large to carry in the event; Output
	// then holds the artifact reference.
	Artifacts []ArtifactRef `json:"artifacts,omitempty"`
	// UserID, StepID and MaxAttempts are copied from the request, for the
	// audit record.
	UserID      string `json:"userId,omitempty"`
	StepID      string `json:"stepId,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
}

// ActionFailed is the failed result of one action call.
type ActionFailed struct {
	RunID      string          `json:"runId"`
	CallID     string          `json:"callId"`
	Cycle      int             `json:"cycle"`
	PlanIndex  int             `json:"planIndex"`
	Attempt    int             `json:"attempt"`
	Action     string          `json:"action"`
	Error      actionbus.Error `json:"error"`
	DurationMs int64           `json:"durationMs"`
	Executor   string          `json:"executor,omitempty"`
	Deliveries int             `json:"deliveries,omitempty"`
	// UserID, StepID and MaxAttempts are copied from the request, for the
	// audit record.
	UserID      string `json:"userId,omitempty"`
	StepID      string `json:"stepId,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
}

// EventRejected carries an event that failed decoding or validation, with
// the reason and everything needed to inspect or replay it — up to a
// bound: an event near the server's max payload must still be rejectable,
// so the original body is kept whole up to [MaxRejectedData] bytes, else
// cut there with its size and hash (OriginalDataBytes, OriginalDataHash),
// and each header value up to [MaxRejectedHeader] bytes.
type EventRejected struct {
	Reason          actionbus.Error     `json:"reason"`
	RunID           string              `json:"runId,omitempty"`
	OriginalSubject string              `json:"originalSubject"`
	OriginalHeaders map[string][]string `json:"originalHeaders,omitempty"`
	OriginalData    []byte              `json:"originalData,omitempty"`
	// OriginalDataBytes and OriginalDataHash (hex SHA-256) are the size
	// and hash of the whole original body when OriginalData holds only
	// its first MaxRejectedData bytes (unset when it is whole).
	OriginalDataBytes int    `json:"originalDataBytes,omitempty"`
	OriginalDataHash  string `json:"originalDataHash,omitempty"`
	Stream            string `json:"stream,omitempty"`
	StreamSequence    uint64 `json:"streamSequence,omitempty"`
	Consumer          string `json:"consumer,omitempty"`
}

// AuditAppended is one append to a run's audit chain: the records of one
// or more stored events of the run, in chain order (each record's
// PrevHash is the hash of the record before it). The auditor appends a
// run's records in batches, so a one-action run is usually one message.
type AuditAppended struct {
	RunID string `json:"runId"`
	// Tenant is the audited run's tenant.
	Tenant  string          `json:"tenant,omitempty"`
	Records []AuditRecorded `json:"records"`
}

// AuditRecordsOf returns the audit records an audit-stream event holds: the
// records of an audit.appended, or the one record of an audit.recorded
// (the one-record-per-message form written before batching). A record that
// names another run or tenant than its message is an error.
func AuditRecordsOf(r *Received) ([]AuditRecorded, error) {
	switch d := r.Data.(type) {
	case *AuditRecorded:
		return []AuditRecorded{*d}, nil
	case *AuditAppended:
		for _, rec := range d.Records {
			if rec.RunID != d.RunID || rec.Tenant != d.Tenant {
				return nil, fmt.Errorf("events: audit append %s holds a record of run %q (tenant %q)", r.Event.ID(), clip(rec.RunID, 64), clip(rec.Tenant, 64))
			}
		}
		return d.Records, nil
	}
	return nil, fmt.Errorf("events: %s holds no audit records", r.Event.Type())
}

// AuditRecorded is one record of the audit stream.
type AuditRecorded struct {
	RunID string `json:"runId"`
	// Tenant is the audited run's tenant.
	Tenant       string    `json:"tenant,omitempty"`
	EventID      string    `json:"eventId"`
	EventType    string    `json:"eventType"`
	EventSubject string    `json:"eventSubject"`
	EventSource  string    `json:"eventSource"`
	EventTime    time.Time `json:"eventTime"`
	// RetryOf (on a run.started record) names the run this run retries;
	// RetriedBy (on a "retried" step record) the run that retries it.
	RetryOf   string `json:"retryOf,omitempty"`
	RetriedBy string `json:"retriedBy,omitempty"`
	// Kind groups records (run, step, policy, decision, synthesis,
	// action, approval, input, timer, rejected); it is the last token of
	// the audit subject.
	Kind string `json:"kind"`
	// ExecutionID is the action call id (or the approval id).
	ExecutionID string `json:"executionId,omitempty"`
	StepID      string `json:"stepId,omitempty"`
	UserID      string `json:"userId,omitempty"`
	Action      string `json:"action,omitempty"`
	Mode        string `json:"mode,omitempty"`
	Status      string `json:"status,omitempty"`
	Attempt     int    `json:"attempt,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
	Summary     string `json:"summary,omitempty"`
	// Input, Output and Error are the payloads after the payload policy
	// (PayloadModes says which modes applied); OutputSummary is set in
	// summary mode.
	Input         any               `json:"input,omitempty"`
	Output        any               `json:"output,omitempty"`
	OutputSummary string            `json:"outputSummary,omitempty"`
	Error         any               `json:"error,omitempty"`
	PayloadModes  map[string]string `json:"payloadModes,omitempty"`
	// ApprovalTokenHash and IdempotencyKeyHash are SHA-256 (hex) of the
	// raw values, which never appear in audit.
	ApprovalTokenHash  string `json:"approvalTokenHash,omitempty"`
	IdempotencyKeyHash string `json:"idempotencyKeyHash,omitempty"`
	// Policy is the policy evaluation snapshot of a policy record, or of
	// the evaluation that admitted an action record's call.
	Policy      any    `json:"policy,omitempty"`
	PayloadHash string `json:"payloadHash"`
	// Usage is, on a decision or synthesis record, what each of its LLM
	// calls used (one entry per call); RunUsage, on a run's terminal
	// record, what all of the run's calls used.
	Usage    []LLMUsage `json:"usage,omitempty"`
	RunUsage *RunUsage  `json:"runUsage,omitempty"`
	// Duplicate names, on a record whose status is "duplicate", why a
	// call's result came again after its outcome was recorded:
	// "redispatch" (it carries the result id the protocol derives for the
	// call, see [ResultID]: the call was answered again) or "forgery" (any
	// other id: no conforming executor publishes it). DuplicateOf is the
	// event id of the call's outcome.
	Duplicate   string `json:"duplicate,omitempty"`
	DuplicateOf string `json:"duplicateOf,omitempty"`
	// V is the chain format: 0 (absent) for format 1, unsigned records
	// written before chains were signed; 2 for signed records.
	V int `json:"v,omitempty"`
	// N is a format-2 record's place in its chain: 1 for the first
	// format-2 record, each next record one more. A gap in N is records
	// removed.
	N uint64 `json:"n,omitempty"`
	// Source is the stream and stream sequence of the audited event (format
	// 2).
	Source   *AuditSource `json:"source,omitempty"`
	PrevHash string       `json:"prevHash"`
	Hash     string       `json:"hash"`
	// Signer and Sig sign a format-2 append: the last record of every
	// append carries the auditor's public key (an nkeys account key,
	// "A...") and its Ed25519 signature (base64url, unpadded) over
	// "actionbus.audit.v2:" followed by the record's hash. The hash
	// chains every record before it, so one signature covers the append
	// and the chain up to it. Sig is not part of the hash.
	Signer string `json:"signer,omitempty"`
	Sig    string `json:"sig,omitempty"`
}

// AuditSource names the stored event an audit record records.
type AuditSource struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
}
