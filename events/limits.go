package events

import (
	"fmt"
	"time"
)

// RunLimits bound every run a dispatcher runs: its cycles, plans,
// parallelism, deadlines, sizes and budgets. The zero value of a field
// takes the default named in its comment ([RunLimits.SetDefaults]). The
// dispatcher enforces them (its flags set them); a test stack
// (actionbustest.StackOptions.Limits) passes them to its dispatcher.
type RunLimits struct {
	// MaxCycles bounds planner cycles per run; default 12.
	MaxCycles int
	// MaxPlanActions bounds the actions of one plan; default 10.
	MaxPlanActions int
	// MaxPlanParallel bounds the calls in flight of one cycle (and of a
	// workflow); default 8.
	MaxPlanParallel int
	// MaxSectionParallel bounds the synthesis requests in flight; default 4.
	MaxSectionParallel int
	// MaxFailedRounds stops the loop when the same action failed this many
	// consecutive rounds; default 2.
	MaxFailedRounds int
	// RunDeadline bounds a run that does not give its own; default 10m.
	RunDeadline time.Duration
	// DecisionTimeout bounds one planner decision and a synthesis;
	// default 2m.
	DecisionTimeout time.Duration
	// ActionGrace is added to an action's timeout before its stage is
	// declared stalled; default 30s.
	ActionGrace time.Duration
	// InputTimeout bounds the wait for a clarify answer; default 24h.
	InputTimeout time.Duration
	// ApprovalTTL is how long an approval request stays valid; default 1h.
	ApprovalTTL time.Duration
	// ObservationBytes bounds one observation's output as the planner
	// sees it; default 4096.
	ObservationBytes int
	// InlineOutputBytes is the largest action output a workflow run keeps
	// in its state; a larger one is kept as a digest, the full value
	// staying in the action's result (and artifact) for whoever needs it.
	// Default 16384.
	InlineOutputBytes int
	// RunBudget is the host's budget of every agent run: a run that
	// asks for none gets it, and a request for more (tokens or cost) is
	// refused with budget_exceeded, never granted. Zero fields bound
	// nothing (the default).
	RunBudget Budget
	// TenantBudgets are each tenant's budget per UTC day, across all its
	// runs, keyed by tenant ("*": every tenant without its own). The
	// planners enforce it: a call that would go over is not made, and a
	// tenant over it has its agent runs end budget_exceeded at their
	// first call until the day ends. None by default.
	TenantBudgets map[string]Budget
}

// The defaults of [RunLimits], named once: for SetDefaults, the
// dispatcher's flags and the docs. MaxPlanActionsCeiling is the most
// actions a plan may ever hold, whatever the limits say.
const (
	DefaultMaxCycles          = 12
	DefaultMaxPlanActions     = 10
	MaxPlanActionsCeiling     = 20
	DefaultMaxPlanParallel    = 8
	DefaultMaxSectionParallel = 4
	DefaultMaxFailedRounds    = 2
	DefaultObservationBytes   = 4096
	DefaultInlineOutputBytes  = 16 << 10
	DefaultRunDeadline        = 10 * time.Minute
	DefaultDecisionTimeout    = 2 * time.Minute
	DefaultActionGrace        = 30 * time.Second
	DefaultInputTimeout       = 24 * time.Hour
	DefaultApprovalTTL        = time.Hour
)

// MaxRunDeadline is the longest whole-run deadline, of the limits or of a
// request (run.requested's deadlineMs at most 31 536 000 000): a year.
const MaxRunDeadline = 365 * 24 * time.Hour

// SetDefaults fills zero fields with their defaults.
func (l *RunLimits) SetDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxCycles, DefaultMaxCycles)
	def(&l.MaxPlanActions, DefaultMaxPlanActions)
	def(&l.MaxPlanParallel, DefaultMaxPlanParallel)
	def(&l.MaxSectionParallel, DefaultMaxSectionParallel)
	def(&l.MaxFailedRounds, DefaultMaxFailedRounds)
	def(&l.ObservationBytes, DefaultObservationBytes)
	def(&l.InlineOutputBytes, DefaultInlineOutputBytes)
	defD(&l.RunDeadline, DefaultRunDeadline)
	defD(&l.DecisionTimeout, DefaultDecisionTimeout)
	defD(&l.ActionGrace, DefaultActionGrace)
	defD(&l.InputTimeout, DefaultInputTimeout)
	defD(&l.ApprovalTTL, DefaultApprovalTTL)
}

// Validate reports limits out of range (after SetDefaults: zero is a
// default, not an error).
func (l *RunLimits) Validate() error {
	switch {
	case l.MaxPlanActions < 1 || l.MaxPlanActions > MaxPlanActionsCeiling:
		return fmt.Errorf("run limits: MaxPlanActions must be 1 to %d, got %d", MaxPlanActionsCeiling, l.MaxPlanActions)
	case l.MaxPlanParallel < 1:
		return fmt.Errorf("run limits: MaxPlanParallel must be at least 1, got %d", l.MaxPlanParallel)
	case l.MaxSectionParallel < 1:
		return fmt.Errorf("run limits: MaxSectionParallel must be at least 1, got %d", l.MaxSectionParallel)
	case l.MaxCycles < 1:
		return fmt.Errorf("run limits: MaxCycles must be at least 1, got %d", l.MaxCycles)
	case l.MaxFailedRounds < 1:
		return fmt.Errorf("run limits: MaxFailedRounds must be at least 1, got %d", l.MaxFailedRounds)
	case l.RunDeadline < time.Second || l.DecisionTimeout < time.Second || l.ActionGrace < 0 || l.InputTimeout < time.Second || l.ApprovalTTL < time.Second:
		return fmt.Errorf("run limits: deadlines must be at least one second (timers have second precision)")
	case l.RunDeadline > MaxRunDeadline:
		return fmt.Errorf("run limits: RunDeadline must be at most %s, got %s", MaxRunDeadline, l.RunDeadline)
	case l.ObservationBytes < 256:
		return fmt.Errorf("run limits: ObservationBytes must be at least 256, got %d", l.ObservationBytes)
	case l.InlineOutputBytes < 1024:
		return fmt.Errorf("run limits: InlineOutputBytes must be at least 1024, got %d", l.InlineOutputBytes)
	case l.RunBudget.MaxTokens < 0 || l.RunBudget.MaxCostUSD < 0:
		return fmt.Errorf("run limits: RunBudget must not be negative")
	}
	for tenant, b := range l.TenantBudgets {
		if b.MaxTokens < 0 || b.MaxCostUSD < 0 {
			return fmt.Errorf("run limits: the budget of tenant %q must not be negative", tenant)
		}
	}
	return nil
}
