package events_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/actionbus/actionbus/events"
)

func TestRunLimitsDefaultsAreValidAndOnlyFillZeroFields(t *testing.T) {
	var l events.RunLimits
	l.SetDefaults()
	if err := l.Validate(); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
	want := events.RunLimits{
		MaxCycles: events.DefaultMaxCycles, MaxPlanActions: events.DefaultMaxPlanActions, MaxPlanParallel: events.DefaultMaxPlanParallel,
		MaxSectionParallel: events.DefaultMaxSectionParallel, MaxFailedRounds: events.DefaultMaxFailedRounds,
		RunDeadline: events.DefaultRunDeadline, DecisionTimeout: events.DefaultDecisionTimeout, ActionGrace: events.DefaultActionGrace,
		InputTimeout: events.DefaultInputTimeout, ApprovalTTL: events.DefaultApprovalTTL,
		ObservationBytes: events.DefaultObservationBytes, InlineOutputBytes: events.DefaultInlineOutputBytes,
	}
	if fmt.Sprint(l) != fmt.Sprint(want) {
		t.Fatalf("defaults\n got %+v\nwant %+v", l, want)
	}
	set := events.RunLimits{MaxPlanParallel: 3, RunDeadline: time.Minute}
	set.SetDefaults()
	if set.MaxPlanParallel != 3 || set.RunDeadline != time.Minute {
		t.Fatalf("SetDefaults replaced a set field: %+v", set)
	}
}

func TestRunLimitsOutOfRangeAreRefusedByName(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*events.RunLimits)
		want string
	}{
		{"a plan above the ceiling", func(l *events.RunLimits) { l.MaxPlanActions = events.MaxPlanActionsCeiling + 1 }, "MaxPlanActions must be 1 to 20"},
		{"a negative plan", func(l *events.RunLimits) { l.MaxPlanActions = -1 }, "MaxPlanActions"},
		{"no parallelism", func(l *events.RunLimits) { l.MaxPlanParallel = -1 }, "MaxPlanParallel"},
		{"no section parallelism", func(l *events.RunLimits) { l.MaxSectionParallel = -2 }, "MaxSectionParallel"},
		{"no cycles", func(l *events.RunLimits) { l.MaxCycles = -1 }, "MaxCycles"},
		{"no failed rounds", func(l *events.RunLimits) { l.MaxFailedRounds = -1 }, "MaxFailedRounds"},
		{"a sub-second deadline", func(l *events.RunLimits) { l.RunDeadline = 500 * time.Millisecond }, "at least one second"},
		{"a sub-second decision", func(l *events.RunLimits) { l.DecisionTimeout = time.Millisecond }, "at least one second"},
		{"a negative grace", func(l *events.RunLimits) { l.ActionGrace = -time.Second }, "at least one second"},
		{"a negative approval lifetime", func(l *events.RunLimits) { l.ApprovalTTL = -time.Hour }, "at least one second"},
		{"a sub-second approval lifetime", func(l *events.RunLimits) { l.ApprovalTTL = time.Millisecond }, "at least one second"},
		{"a deadline beyond a year", func(l *events.RunLimits) { l.RunDeadline = events.MaxRunDeadline + time.Second }, "RunDeadline must be at most"},
		{"a tiny observation", func(l *events.RunLimits) { l.ObservationBytes = 255 }, "ObservationBytes"},
		{"a tiny inline output", func(l *events.RunLimits) { l.InlineOutputBytes = 1023 }, "InlineOutputBytes"},
		{"a negative run budget", func(l *events.RunLimits) { l.RunBudget.MaxTokens = -1 }, "RunBudget"},
		{"a negative tenant budget", func(l *events.RunLimits) {
			l.TenantBudgets = map[string]events.Budget{"acme": {MaxCostUSD: -0.5}}
		}, `tenant "acme"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l events.RunLimits
			l.SetDefaults()
			tc.set(&l)
			err := l.Validate()
			if err == nil {
				t.Fatalf("%+v accepted", l)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

// Limits for a dispatcher (or actionbustest.StackOptions.Limits): set what
// differs, and the rest takes its default.
func ExampleRunLimits() {
	l := events.RunLimits{MaxPlanParallel: 3, RunBudget: events.Budget{MaxTokens: 50_000}}
	l.SetDefaults()
	fmt.Println(l.MaxPlanParallel, l.MaxPlanActions, l.RunDeadline, l.Validate())
	// Output: 3 10 10m0s <nil>
}
