package run

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/policy"
)

// limited gives t.read a limit.
func limited(h *harness, spec limits.Spec) *harness {
	h.env.catalog["t.read"].Limits = &spec
	return h
}

func waitingSteps(out []Effect) int {
	n := 0
	for _, e := range out {
		if e.Kind == EffectStep && e.Step.Name == string(StepWaitingForCapacity) {
			n++
		}
	}
	return n
}

func wakes(out []Effect) []Effect {
	_, w := Stored(out)
	return w
}

func TestCallsOverALimitWaitAndStartWhenASlotFrees(t *testing.T) {
	h := limited(newHarness(t, events.RunLimits{}), limits.Spec{MaxInFlight: 1}).agent()
	out := h.decide(plan(action("t.read", map[string]any{"i": 0}), action("t.read", map[string]any{"i": 1}), action("t.read", map[string]any{"i": 2})))
	require.Len(t, h.dispatched(), 1, "one slot")
	assert.Equal(t, 2, waitingSteps(out), "each waiting call says so once")
	require.Len(t, wakes(out), 1, "the dispatcher is asked to wake the run")
	require.NotNil(t, h.timer(events.TimerCapacity), "a durable backstop is armed")
	assert.Equal(t, "capacity of t.read", Summarize(h.st, h.env.Now()).Waiting)

	// Asked again while the slot is held: nothing to store, another wake.
	out = h.apply(&CapacityCheck{})
	stored, w := Stored(out)
	assert.Empty(t, stored)
	assert.Len(t, w, 1)

	first := h.st.Calls[0].CallID
	out = h.succeed(first, map[string]any{"ok": true})
	require.True(t, has(out, EffectRelease), "a done call frees its slot")
	h.apply(&CapacityCheck{})
	require.Len(t, h.dispatched(), 1, "the next call in line starts")
	assert.Equal(t, 1, h.st.Calls[1].PlanIndex)
	assert.Equal(t, 0, waitingSteps(h.last), "a call says it waits only once")

	h.succeed(h.st.Calls[1].CallID, map[string]any{"ok": true})
	h.fire(events.TimerCapacity) // the backstop works as a wake-up
	require.Len(t, h.dispatched(), 1)
	h.succeed(h.st.Calls[2].CallID, map[string]any{"ok": true})
	assert.Equal(t, PhaseDeciding, h.st.Phase, "every call ran; the planner is asked")
}

func TestKeysAreIndependent(t *testing.T) {
	h := limited(newHarness(t, events.RunLimits{}), limits.Spec{Key: "{{.input.k}}", MaxInFlight: 1}).agent()
	h.decide(plan(action("t.read", map[string]any{"k": "a"}), action("t.read", map[string]any{"k": "a"}), action("t.read", map[string]any{"k": "b"})))
	var started []int
	for _, c := range h.dispatched() {
		started = append(started, c.PlanIndex)
	}
	assert.Equal(t, []int{0, 2}, started, "key b is not held up behind key a's queue")
}

func TestTheRunDeadlineEndsAWaitForCapacity(t *testing.T) {
	h := limited(newHarness(t, events.RunLimits{}), limits.Spec{MaxInFlight: 1}).agent()
	h.decide(plan(action("t.read", map[string]any{"i": 0}), action("t.read", map[string]any{"i": 1})))
	out := h.fire(events.TimerRunDeadline)
	assert.Equal(t, "run_deadline_exceeded", string(h.code()))
	var released []string
	for _, e := range out {
		if e.Kind == EffectRelease {
			released = append(released, e.CallID)
		}
	}
	assert.ElementsMatch(t, []string{h.st.Calls[0].CallID, h.st.Calls[1].CallID}, released,
		"the held slot and the queue place are given up")
	assert.Empty(t, h.env.limits["t.read"].Holders)
	assert.Empty(t, h.env.limits["t.read"].Waiting)
}

func TestPolicyOverridesTheDeclaredLimit(t *testing.T) {
	h := limited(newHarness(t, events.RunLimits{}), limits.Spec{MaxInFlight: 1})
	h.env.policy = &policy.Evaluator{Config: &policy.Config{Limits: map[string]limits.Spec{"t.read": {MaxInFlight: 3}}}}
	h.agent()
	h.decide(plan(action("t.read", map[string]any{"i": 0}), action("t.read", map[string]any{"i": 1}), action("t.read", map[string]any{"i": 2})))
	assert.Len(t, h.dispatched(), 3)
}

func TestWorkflowStepsWaitForCapacityToo(t *testing.T) {
	h := limited(newHarness(t, events.RunLimits{}), limits.Spec{MaxInFlight: 1}).workflow(`{"workflowName":"w","steps":[
		{"id":"a","action":"t.read","input":{"i":0}},{"id":"b","action":"t.read","input":{"i":1}}]}`)
	require.Len(t, h.dispatched(), 1)
	h.succeed(h.st.Calls[0].CallID, map[string]any{"ok": true})
	h.apply(&CapacityCheck{})
	require.Len(t, h.dispatched(), 1)
	h.succeed(h.st.Calls[1].CallID, map[string]any{"ok": true})
	assert.Equal(t, StatusCompleted, h.st.Status)
}

// An action of a pool dedicated to other tenants is refused to a run;
// the tenants it serves may call it.
func TestADedicatedPoolServesOnlyItsTenants(t *testing.T) {
	for _, tc := range []struct {
		tenant string
		ok     bool
	}{{"", false}, {"globex", false}, {"acme", true}} {
		h := newHarness(t, events.RunLimits{})
		h.env.catalog["t.read"].Tenants = []string{"acme"}
		h.start(events.RunRequested{Tenant: tc.tenant, Action: &events.ActionCall{Name: "t.read", Args: map[string]any{}}})
		if tc.ok {
			assert.Len(t, h.dispatched(), 1, "tenant %q", tc.tenant)
			continue
		}
		assert.Empty(t, h.dispatched(), "tenant %q", tc.tenant)
		assert.Equal(t, "tenant_not_served", string(h.code()), "tenant %q", tc.tenant)
	}
}

// TestARunsBudgetIsCappedByTheHostAndItsTenantsDay: the request's budget,
// the host's run budget and the tenant's daily budget, field by field; a
// request above the host's run budget is refused.
func TestARunsBudgetIsCappedByTheHostAndItsTenantsDay(t *testing.T) {
	lim := events.RunLimits{RunBudget: events.Budget{MaxTokens: 5000}, TenantBudgets: map[string]events.Budget{
		"acme": {MaxTokens: 3000, MaxCostUSD: 1}, "*": {MaxCostUSD: 2}}}
	m := New(nil, Config{Limits: lim})
	cases := []struct {
		name, tenant string
		asked        *events.Budget
		want         *events.Budget
		refused      bool
	}{
		{"none asked: the host's, within the day", "globex", nil, &events.Budget{MaxTokens: 5000, MaxCostUSD: 2}, false},
		{"a lower one is kept", "globex", &events.Budget{MaxTokens: 100, MaxCostUSD: 0.5}, &events.Budget{MaxTokens: 100, MaxCostUSD: 0.5}, false},
		{"the tenant's day caps it", "acme", &events.Budget{MaxTokens: 4000}, &events.Budget{MaxTokens: 3000, MaxCostUSD: 1}, false},
		{"above the host's is refused", "globex", &events.Budget{MaxTokens: 50000}, nil, true},
		{"negative is refused", "globex", &events.Budget{MaxTokens: -1}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{Tenant: tc.tenant}
			err := m.budget(st, tc.asked)
			if tc.refused {
				require.NotNil(t, err)
				assert.Equal(t, actionbus.CodeBudgetExceeded, err.Code)
				assert.Equal(t, "request", err.Details["budget"])
				return
			}
			require.Nil(t, err)
			assert.Equal(t, tc.want, st.Budget)
		})
	}
}

// scriptedShell answers capacity requests from a script, in order, and
// records what was asked: the machine asks; it takes no slot itself.
type scriptedShell struct {
	answers []Capacity
	asked   []string
}

func (s *scriptedShell) PutArtifact(context.Context, *ArtifactWrite) error { return nil }

func (s *scriptedShell) Acquire(_ context.Context, _ *State, c CallState) (Capacity, error) {
	s.asked = append(s.asked, c.CallID)
	a := s.answers[0]
	s.answers = s.answers[1:]
	if a.Err != "" {
		return Capacity{}, errors.New(a.Err)
	}
	return a, nil
}

// TestACallIsAskedForItsSlotBeforeItIsHandedOut: a transition that would
// hand calls out stops at the first that holds no slot, with an acquire
// effect and nothing handed out; the answers, applied in order, decide
// which calls go (a denied call waits, one behind it with another key
// goes, a limit that cannot be read is asked again in a second), and
// the pass ends as one pass would: one wake-up at the earliest retry, one
// durable backstop.
func TestACallIsAskedForItsSlotBeforeItIsHandedOut(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	out, err := h.m.Apply(context.Background(), h.st, Event{ID: "d", Data: &events.DecisionMade{RunID: testRunID, Cycle: h.st.Cycle,
		Decision: plan(action("t.read", map[string]any{"i": 0}), action("t.read", map[string]any{"i": 1}), action("t.other", nil))}})
	require.NoError(t, err)
	require.Equal(t, EffectAcquire, out[len(out)-1].Kind, "the pass stops at the first call to ask for")
	assert.False(t, has(out, EffectAct), "nothing is handed out before its slot is granted")
	assert.Equal(t, h.st.Calls[0].CallID, out[len(out)-1].Ask.CallID)

	now := h.env.Now()
	shell := &scriptedShell{answers: []Capacity{
		{Key: "k0", RetryAt: now.Add(5 * time.Second), Position: 1, Waiting: 1}, // denied
		{Err: "limits bucket unavailable"},                                      // asked again in a second
		{Key: "k2", OK: true},                                                   // granted
	}}
	rest, err := h.m.Settle(context.Background(), shell, h.st, out)
	require.NoError(t, err)
	assert.Equal(t, []string{h.st.Calls[0].CallID, h.st.Calls[1].CallID, h.st.Calls[2].CallID}, shell.asked, "asked once each, in declaration order")
	assert.False(t, has(rest, EffectAcquire))
	var acts []string
	for _, e := range rest {
		if e.Kind == EffectAct {
			acts = append(acts, e.CallID)
		}
	}
	assert.Equal(t, []string{h.st.Calls[2].CallID}, acts, "only the granted call goes")
	assert.Equal(t, 2, waitingSteps(rest), "each call that waits says so once")
	assert.True(t, h.st.Calls[0].WaitingCapacity && h.st.Calls[1].WaitingCapacity)
	assert.True(t, h.st.Calls[2].Holding, "the granted call holds its slot")
	w := wakes(rest)
	require.Len(t, w, 1)
	assert.Equal(t, now.Add(time.Second), w[0].At, "the earliest retry: the limit that could not be read")
	timers := 0
	for _, e := range rest {
		if e.Kind == EffectTimer && e.Timer.Fired.Kind == events.TimerCapacity {
			timers++
		}
	}
	assert.Equal(t, 1, timers, "one durable backstop")

}

// TestAnAskTheRestOfTheTransitionMadeMootTakesNoSlot: an alarm whose
// capacity timer asks for a call's slot and whose deadline timer, due in
// the same firing, ends the run: the call is not put to its limit, and
// nothing is handed out for the ended run.
func TestAnAskTheRestOfTheTransitionMadeMootTakesNoSlot(t *testing.T) {
	h := limited(newHarness(t, events.RunLimits{}), limits.Spec{MaxInFlight: 1})
	h.alarm = true
	h.agent()
	h.decide(plan(action("t.read", map[string]any{"i": 0}), action("t.read", map[string]any{"i": 1})))
	require.True(t, h.st.Calls[1].WaitingCapacity)
	require.NotNil(t, h.st.Timers, "the capacity backstop and the deadline are pending timers")
	h.env.mu.Lock()
	h.env.now = h.st.Deadline.Add(time.Second) // both are due
	h.env.mu.Unlock()
	out, err := h.m.Apply(context.Background(), h.st, Event{ID: "alarm", Data: &events.TimerFired{Kind: events.TimerAlarm, RunID: testRunID}})
	require.NoError(t, err)
	shell := &scriptedShell{}
	rest, err := h.m.Settle(context.Background(), shell, h.st, out)
	require.NoError(t, err)
	assert.True(t, h.st.IsTerminal(), "the deadline ended the run")
	assert.Empty(t, shell.asked, "no slot is asked for a call of an ended run")
	assert.False(t, has(rest, EffectAct))
}
