package run

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/jsoncodec"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/tracing"
	"github.com/actionbus/actionbus/internal/workflow"
	"github.com/actionbus/actionbus/internal/workspace"
)

// Kind is what a run is.
type Kind string

// Run kinds.
const (
	// KindAgent is a planner-driven run (a prompt).
	KindAgent Kind = "agent"
	// KindExec is one action called by a host.
	KindExec Kind = "exec"
	// KindWorkflow is a JSON workflow.
	KindWorkflow Kind = "workflow"
	// KindRejected is a run whose request was refused before admission.
	KindRejected Kind = "rejected"
)

// Status is where a run stands, as its users see it.
type Status string

// Run statuses.
const (
	StatusRunning          Status = "running"
	StatusAwaitingInput    Status = "awaiting_input"
	StatusAwaitingApproval Status = "awaiting_approval"
	StatusCompleted        Status = "completed"
	StatusFailed           Status = "failed"
	StatusCanceled         Status = "canceled"
)

// Phase is what a running run waits for.
type Phase string

// Phases of a running run.
const (
	PhaseDeciding         Phase = "deciding"
	PhaseActing           Phase = "acting"
	PhaseAwaitingInput    Phase = "awaiting_input"
	PhaseAwaitingApproval Phase = "awaiting_approval"
	PhaseSynthesizing     Phase = "synthesizing"
)

// State is one run: a header every run has, the calls and approvals of
// every run that calls actions, and the part of its kind — Agent for a
// planner-driven run, Workflow for a workflow (an exec run is its one
// call). It is stored as JSON under the run id in the runs bucket and only
// ever updated with a revision check.
type State struct {
	// Header.
	RunID string `json:"runId"`
	// IDKey is a random secret drawn when the run is admitted. Every id
	// derived for the run mixes it in ([State.derive]), so the ids stay
	// deterministic for a restarted dispatcher yet cannot be predicted by
	// anyone who cannot read run state: no executor, planner or client can
	// pre-empt one of the run's events with a forged Nats-Msg-Id and have
	// the real one dropped as a duplicate.
	IDKey string `json:"idKey"`
	// Tenant is the run's tenant, from the subject of its request: every
	// event of the run is published under it, and an event that names the
	// run under another tenant is rejected.
	Tenant string `json:"tenant,omitempty"`
	Kind   Kind   `json:"kind"`
	Status Status `json:"status"`
	Phase  Phase  `json:"phase,omitempty"`
	Cycle  int    `json:"cycle"`
	UserID string `json:"userId,omitempty"`
	// Principal is who the run acts for as authentication established it
	// (a gateway's signed user, else the tenant's NATS clients): the
	// policy's required roles and scopes read it, never Metadata.
	Principal    policy.Principal `json:"principal"`
	AllowedModes []string         `json:"allowedModes,omitempty"`
	Metadata     map[string]any   `json:"metadata,omitempty"`
	CreatedAt    time.Time        `json:"createdAt"`
	UpdatedAt    time.Time        `json:"updatedAt"`
	// Deadline is when the whole run times out.
	Deadline time.Time `json:"deadline"`
	// Terminal holds the run's terminal event once it has one.
	Terminal *Terminal `json:"terminal,omitempty"`
	// RetryOf is the run this run retries, if any.
	RetryOf string `json:"retryOf,omitempty"`
	// Fence is the sequence of the partition fence its writer held (set
	// by the dispatcher on every write, 0 before fences): a dispatcher
	// that reads a state written under a newer fence than its own gives
	// way, whatever a lagging replica tells it about the fences.
	Fence uint64 `json:"fence,omitempty"`
	// RetriedBy is the run that retries this (ended) run: set once, by a
	// revision-checked write of the retry's admission ([Env.ClaimRetry]),
	// so that a run is retried into at most one new run.
	RetriedBy string `json:"retriedBy,omitempty"`
	// Budget bounds what the run's LLM calls may spend (the request's,
	// capped by the host's run budget); nil bounds nothing.
	Budget *events.Budget `json:"budget,omitempty"`
	// TenantBudget is the tenant's daily budget when the run was admitted
	// (nil: none).
	TenantBudget *events.Budget `json:"tenantBudget,omitempty"`
	// Usage is what the run's LLM calls used so far; nil before the first.
	Usage *events.RunUsage `json:"usage,omitempty"`
	// Exec is the call a one-action run was asked for, as requested: a
	// retry asks for the same ([ExecCall.Same]).
	Exec *ExecCall `json:"exec,omitempty"`
	// Trace is the run's starting trace context (W3C): every event of the
	// run carries it, so that every span of the run joins one trace.
	Trace *tracing.Run `json:"trace,omitempty"`
	// StepSeq numbers the run's progress steps.
	StepSeq int `json:"stepSeq,omitempty"`
	// Outbox holds the effects of the last transition until they are
	// published: stored with the state in one revision-checked write, so
	// that a crash between the write and the publishes loses nothing (the
	// next handler of the run publishes them again; their ids are
	// deterministic).
	Outbox []Effect `json:"outbox,omitempty"`

	// Acting: the calls of the current cycle (of a workflow: Calls[i] is
	// step i's current attempt), in declaration order, and what judged
	// them.
	Calls []CallState `json:"calls,omitempty"`
	// Approvals are the pending approvals, by approval id. They live in
	// the run state, so they survive restarts of every service.
	Approvals map[string]*PendingApproval `json:"approvals,omitempty"`
	// ApprovalsDone are the ids of answered approvals (replays are
	// refused).
	ApprovalsDone []string `json:"approvalsDone,omitempty"`
	// ApprovalsExpired are the ids of approvals that expired unanswered
	// (a late grant is refused as expired, not as a replay).
	ApprovalsExpired []string `json:"approvalsExpired,omitempty"`
	// PolicySnapshots are the run's distinct policy evaluations (see
	// recordPolicy); a call names the one that admitted it
	// (CallState.Policy).
	PolicySnapshots []policy.Snapshot `json:"policySnapshots,omitempty"`
	// CallsDueAt is when the run's calls timer is armed (zero: none), the
	// earliest DueAt of its calls in flight or earlier.
	CallsDueAt time.Time `json:"callsDueAt,omitzero"`
	// Timers are the run's pending timers by name; one schedule, the
	// alarm, stands for them all, armed at AlarmAt (see [Arm]).
	Timers map[string]Timer `json:"timers,omitempty"`
	// AlarmAt is when the run's alarm is armed (zero: none).
	AlarmAt time.Time `json:"alarmAt,omitzero"`
	// Diagnostics are facts recorded about the run's inputs (alias
	// rewrites, stripped keys).
	Diagnostics []Diagnostic `json:"diagnostics,omitempty"`
	// DryRuns are the run's successful dryRun calls, by action and
	// canonical input hash, oldest first, at most MaxDryRuns (the newest):
	// an approval context names the one whose input is the input to
	// approve.
	DryRuns []DryRun `json:"dryRuns,omitempty"`

	// Agent is set for agent runs.
	Agent *AgentRun `json:"agent,omitempty"`
	// Workflow is set for workflow runs.
	Workflow *WorkflowRun `json:"workflow,omitempty"`
}

// Encode returns the state's stored form: its JSON, as encoding/json
// writes it (a transition encodes the whole state, so the faster encoder
// of [jsoncodec] is used).
func (st *State) Encode() ([]byte, error) { return jsoncodec.Marshal(st) }

// DecodeState reads a state's stored form.
func DecodeState(b []byte) (State, error) {
	var st State
	err := jsoncodec.Unmarshal(b, &st)
	return st, err
}

// AgentRun is the part of a planner-driven run: what the planner is told
// and what the loop remembers between cycles.
type AgentRun struct {
	Prompt   string `json:"prompt,omitempty"`
	Scenario string `json:"scenario,omitempty"`
	// Replay holds the recorded decisions of a replay run.
	Replay *events.Replay `json:"replay,omitempty"`
	// Observations are what the planner has seen, in order.
	Observations []events.Observation `json:"observations"`
	// Feedback tells the planner why its last decision did not run.
	Feedback *actionbus.Error `json:"feedback,omitempty"`
	// Plan describes the current cycle's plan, when it is one.
	Plan *PlanState `json:"plan,omitempty"`
	// Question is the clarify question the run waits on.
	Question string `json:"question,omitempty"`
	// Synthesize is the synthesize instruction for the next decision.
	Synthesize string `json:"synthesize,omitempty"`
	// Synthesis is the per-action synthesis in progress.
	Synthesis *SynthesisState `json:"synthesis,omitempty"`
	// FailStreaks counts, per action, consecutive rounds that failed;
	// FailEvidence keeps the errors of the current streaks.
	FailStreaks  map[string]int               `json:"failStreaks,omitempty"`
	FailEvidence map[string][]actionbus.Error `json:"failEvidence,omitempty"`
	// Skills is the run's skill state (the seed's agentSkills,
	// agentSkillContext and activeAgentSkill); nil until a skill action.
	Skills *SkillState `json:"skills,omitempty"`
	// Workspace is the run's virtual workspace; nil until the request
	// gives one or a workspace action creates it.
	Workspace *workspace.Workspace `json:"workspace,omitempty"`
	// Withhold are actions withheld from the next decision's surface.
	Withhold []string `json:"withhold,omitempty"`
}

// PendingApproval is an approval the run waits for.
type PendingApproval struct {
	Context   events.ApprovalContext `json:"context"`
	CallIndex int                    `json:"callIndex"`
	// Reason is the policy's reason for asking.
	Reason string `json:"reason,omitempty"`
}

// PlanState is what the dispatcher remembers of a plan decision.
type PlanState struct {
	PartialOK             bool   `json:"partialOk,omitempty"`
	SynthesizeInstruction string `json:"synthesizeInstruction,omitempty"`
	// PerAction asks for a per-action synthesis; Sections are the plan
	// actions' sections in declaration order.
	PerAction bool             `json:"perAction,omitempty"`
	Sections  []events.Section `json:"sections,omitempty"`
	Stitch    *events.Stitch   `json:"stitch,omitempty"`
}

// Diagnostic is one recorded fact about a run's inputs.
type Diagnostic struct {
	Name      string         `json:"name"`
	Cycle     int            `json:"cycle"`
	PlanIndex *int           `json:"planIndex,omitempty"`
	Action    string         `json:"action"`
	Details   map[string]any `json:"details"`
}

// CallState is one action call of the current cycle.
type CallState struct {
	// Skill and Tool name the skill tool an execute_skill_tool call runs
	// (Action is its hidden action, skill.<skill>.<tool>).
	Skill      string           `json:"skill,omitempty"`
	Tool       string           `json:"tool,omitempty"`
	PlanIndex  int              `json:"planIndex"`
	CallID     string           `json:"callId"`
	Action     string           `json:"action"`
	Pool       string           `json:"pool"`
	Args       map[string]any   `json:"args,omitempty"`
	Origin     string           `json:"origin"`
	Dispatched bool             `json:"dispatched,omitempty"`
	Done       bool             `json:"done,omitempty"`
	OK         bool             `json:"ok,omitempty"`
	Output     any              `json:"output,omitempty"`
	Summary    string           `json:"summary,omitempty"`
	Complete   bool             `json:"complete,omitempty"`
	Error      *actionbus.Error `json:"error,omitempty"`
	Executor   string           `json:"executor,omitempty"`
	TimeoutMs  int64            `json:"timeoutMs,omitempty"`
	// IdempotencyKey travels with the call to the executor.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// Approval is the call's verified approval, when it needed one.
	Approval *events.ApprovalGrant `json:"approval,omitempty"`
	// NeedsApproval marks a call held until its approval is granted.
	NeedsApproval bool `json:"needsApproval,omitempty"`
	// Mode is the action's mode.
	Mode string `json:"mode,omitempty"`
	// Attempt is the attempt number of a workflow step's call; StepID
	// and MaxAttempts name its step and retry policy.
	Attempt     int    `json:"attempt,omitempty"`
	StepID      string `json:"stepId,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
	// LimitKey is the key of the action's limit the call counts against
	// ("" when the action has none); Holding says it holds a slot (to be
	// released when it is done), WaitingCapacity that it waits for one.
	// Redispatched marks a call whose request was sent a second time
	// after it went unanswered past its deadline.
	Redispatched    bool   `json:"redispatched,omitempty"`
	LimitKey        string `json:"limitKey,omitempty"`
	Holding         bool   `json:"holding,omitempty"`
	WaitingCapacity bool   `json:"waitingCapacity,omitempty"`
	// Policy is 1 + the index in State.PolicySnapshots of the evaluation
	// that admitted the call (0: none); its work item carries it.
	Policy int `json:"policy,omitempty"`
	// DueAt is when a dispatched call's silence is acted on (its timeout
	// plus the grace); the run's calls timer covers it.
	DueAt time.Time `json:"dueAt,omitzero"`
}

// Capacity is a limit's answer to a call asking for a slot.
type Capacity struct {
	// Key is the limit's key of the call ("" when its action has none).
	Key string
	// OK: the call holds a slot and may start.
	OK bool
	// RetryAt is when to ask again (not OK).
	RetryAt time.Time
	// Position is the call's place in the key's queue; Waiting how many
	// calls wait on the key.
	Position, Waiting int
	// Err says why the limit could not be asked (it is asked again).
	Err string
}

func (c Capacity) describe() string {
	if c.Err != "" {
		return "limit " + c.Key + " unavailable: " + c.Err
	}
	return fmt.Sprintf("limit %s: position %d of %d waiting", c.Key, c.Position+1, c.Waiting)
}

// CapacityAsk is what an [EffectAcquire] asks: a slot for the call at
// index Call of the run's calls (CallID, to tell a stale answer), and
// where the dispatch pass that asked goes on once it is answered — the
// earliest retry time of the calls that found no slot so far, whether one
// of them started waiting in this pass, and whether the pass answers the
// capacity timer (its wake-up gets a timer of its own).
type CapacityAsk struct {
	Call         int
	CallID       string
	RetryAt      time.Time
	NewlyWaiting bool
	Durable      bool
}

// CapacityAnswer answers a [CapacityAsk] with what the call's limit
// granted (Capacity.Err when it could not be asked): [Machine.Settle]
// applies it as soon as it has the answer, before anything of the
// transition is stored or published. It is never published.
type CapacityAnswer struct {
	Ask      CapacityAsk
	Capacity Capacity
}

// CapacityCheck is the in-process event that asks a run's waiting calls'
// limits again (a dispatcher wakes the run with it at their retry time or
// when a slot frees). It is never published: the capacity timer is its
// durable backstop.
type CapacityCheck struct{}

// WorkflowRun is the state of a workflow run: its definition and where
// each step stands. Calls[i] is step i's current attempt.
type WorkflowRun struct {
	Def   workflow.Workflow `json:"def"`
	Steps []StepRun         `json:"steps"`
}

// StepStatus is where a workflow step stands.
type StepStatus string

// Workflow step statuses.
const (
	StepStatusPending      StepStatus = "pending"
	StepStatusReady        StepStatus = "ready"
	StepStatusWaitingRetry StepStatus = "waiting_retry"
	StepStatusDone         StepStatus = "done"
	StepStatusFailed       StepStatus = "failed"
)

// StepRun is one step of a workflow run.
type StepRun struct {
	Status  StepStatus       `json:"status"`
	Attempt int              `json:"attempt"`
	Output  any              `json:"output,omitempty"`
	Error   *actionbus.Error `json:"error,omitempty"`
}

// Terminal is a run's terminal event.
type Terminal struct {
	Type      string           `json:"type"`
	Answer    string           `json:"answer,omitempty"`
	Output    any              `json:"output,omitempty"`
	Citations []string         `json:"citations,omitempty"`
	Error     *actionbus.Error `json:"error,omitempty"`
	Reason    string           `json:"reason,omitempty"`
}

// IsTerminal reports whether the run has ended.
func (s *State) IsTerminal() bool { return s.Terminal != nil }

// TenantOrDefault is the run's tenant (states stored before tenants
// existed belong to the default tenant).
func (s *State) TenantOrDefault() string { return events.TenantOr(s.Tenant) }

// CheckTenant refuses an event that names the run under another tenant
// than the run's: a tenant's users may write only their tenant's subjects,
// so an event on another tenant's subject with this run's id is forged or
// misdirected, and changes nothing. It is refused as an event for a run
// the tenant never had ([NoRun]): the answer tells nothing of the other
// tenant's run.
func (s *State) CheckTenant(tenant string) error {
	if tenant == "" || tenant == s.TenantOrDefault() {
		return nil
	}
	return NoRun(s.RunID, tenant)
}

// NoRun is the answer to an event for a run its tenant never requested:
// run_not_found, the same whether the run id is another tenant's or
// nobody's.
func NoRun(runID, tenant string) *actionbus.Error {
	return actionbus.Errorf(actionbus.CodeRunNotFound, "tenant %s has no run %s", events.TenantOr(tenant), runID).
		WithDetail("runId", runID)
}

func (s *State) inFlight() int {
	n := 0
	for _, c := range s.Calls {
		if c.Dispatched && !c.Done {
			n++
		}
	}
	return n
}

func (s *State) allDone() bool {
	for _, c := range s.Calls {
		if !c.Done {
			return false
		}
	}
	return true
}

func (s *State) callIndex(callID string) int {
	for i, c := range s.Calls {
		if c.CallID == callID {
			return i
		}
	}
	return -1
}

// derive returns the deterministic id of one of the run's events, keyed by
// the run's secret [State.IDKey].
func (st *State) derive(parts ...any) string {
	return events.DerivedID(st.RunID, append([]any{st.IDKey}, parts...)...)
}

// NewIDKey draws a run's id key: 128 random bits, hex.
func NewIDKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// LimitCall is what the key expression of call c's limit may read.
func LimitCall(st *State, c CallState) limits.Call {
	return limits.Call{Tenant: st.TenantOrDefault(), UserID: st.UserID, Action: c.Action, Metadata: st.Metadata, Input: c.Args}
}

// LimitRequest is the request of call c for a slot: held, unless
// released, for the call's timeout and grace (a call whose dispatcher
// vanished frees its slot then).
func LimitRequest(st *State, c CallState, grace time.Duration) limits.Request {
	return limits.Request{CallID: c.CallID, RunID: st.RunID, Tenant: st.TenantOrDefault(),
		Lease: time.Duration(c.TimeoutMs)*time.Millisecond + grace}
}

// recordPolicy keeps snap among the run's policy evaluations and returns
// the reference a call holds to it (1 + its index). An evaluation equal
// to one kept already — the same action allowed on the same grounds, as
// for every step of a fan-out — shares it: a plan's state holds each
// distinct verdict once, not once per call (a tenth of a ten-wide
// workflow's state was ten copies of one verdict).
func (st *State) recordPolicy(snap policy.Snapshot) int {
	for i := len(st.PolicySnapshots) - 1; i >= 0; i-- {
		if st.PolicySnapshots[i] == snap {
			return i + 1
		}
	}
	st.PolicySnapshots = append(st.PolicySnapshots, snap)
	return len(st.PolicySnapshots)
}

// ExecCall is the call a one-action run was asked for: its action and the
// hash of its arguments as the request gave them (policy.InputHash).
type ExecCall struct {
	Action   string `json:"action"`
	ArgsHash string `json:"argsHash"`
}

// execCallOf is the ExecCall of a requested call.
func execCallOf(c *events.ActionCall) *ExecCall {
	h, err := policy.InputHash(c.Args)
	if err != nil {
		h = "unhashable"
	}
	return &ExecCall{Action: c.Name, ArgsHash: h}
}

// Same reports whether e, a retry's requested call, is the call of the
// run it retries: the same action with the same arguments. A run stored
// before runs kept their call is compared with its first call, as the
// dispatcher prepared it; one that called nothing has nothing to compare
// with, and is not retried.
func (e *ExecCall) Same(prior *State) bool {
	switch {
	case prior.Exec != nil:
		return *prior.Exec == *e
	case len(prior.Calls) > 0:
		return *execCallOf(&events.ActionCall{Name: prior.Calls[0].Action, Args: prior.Calls[0].Args}) == *e
	}
	return false
}

// PoolsInFlight returns the pools holding a call of the run that was sent
// and not answered, each once, in call order: the executors that must
// hear that the run ended, to stop the call or not start it.
func (st *State) PoolsInFlight() []string {
	var pools []string
	for _, c := range st.Calls {
		if c.Dispatched && !c.Done && c.Pool != "" && !slices.Contains(pools, c.Pool) {
			pools = append(pools, c.Pool)
		}
	}
	return pools
}
