package run

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/limits"
)

func TestStoredEndReadsEveryTerminalEventAndNothingElse(t *testing.T) {
	cause := actionbus.Error{Code: actionbus.CodeApprovalDenied, Message: "denied"}
	for _, tc := range []struct {
		name string
		data any
		want *Terminal
	}{
		{"completed", &events.RunCompleted{Answer: "done", Output: map[string]any{"ok": true}},
			&Terminal{Type: events.TypeRunCompleted, Answer: "done", Output: map[string]any{"ok": true}}},
		{"failed", &events.RunFailed{Error: cause}, &Terminal{Type: events.TypeRunFailed, Error: &cause}},
		{"canceled", &events.RunCanceled{Reason: "stop"}, &Terminal{Type: events.TypeRunCanceled, Reason: "stop"}},
		{"not an end", &events.RunStarted{}, nil},
		{"nothing", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := StoredEnd(tc.data)
			assert.Equal(t, tc.want != nil, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestAdoptEndsTheRunAsItsStoredEndSays: a run holding a limit's slot,
// with its end stored (a run.canceled) and its state not written, adopts
// the end whatever the state in hand would decide: it is canceled, its
// slot is released, and no second end is asked for.
func TestAdoptEndsTheRunAsItsStoredEndSays(t *testing.T) {
	h := limited(newHarness(t, events.RunLimits{}), limits.Spec{MaxInFlight: 1}).agent()
	h.decide(plan(action("t.read", map[string]any{"i": 0})))
	require.Len(t, h.dispatched(), 1)
	require.False(t, h.st.IsTerminal())

	out := h.m.Adopt(h.st, &Terminal{Type: events.TypeRunCanceled, Reason: "operator"})
	require.True(t, h.st.IsTerminal())
	assert.Equal(t, StatusCanceled, h.st.Status)
	assert.Equal(t, "operator", h.st.Terminal.Reason)
	assert.Equal(t, EndID(h.st), endEffect(h.st).ID, "the end id is the run's, whichever end it adopted")
	assert.True(t, has(out, EffectRelease), "the slot the run held is released")
	assert.False(t, has(out, EffectEnd), "the end is stored already: it is not published again")

	// A result arriving after changes nothing.
	out = h.succeed(h.st.Calls[0].CallID, map[string]any{"ok": true})
	assert.Empty(t, out)
	assert.Equal(t, StatusCanceled, h.st.Status)
}
