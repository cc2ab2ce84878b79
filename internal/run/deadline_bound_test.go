package run

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
)

// TestARequestsDeadlineIsBoundedAndNeverWraps: the schema refuses a
// deadlineMs over a year; one that reaches the machine anyway (a replay of
// an old log) is capped there, instead of wrapping the duration
// (time.Duration(DeadlineMs)*time.Millisecond overflows past about
// 9.2e12 ms) into a deadline before the run's start.
func TestARequestsDeadlineIsBoundedAndNeverWraps(t *testing.T) {
	h := newHarness(t, events.RunLimits{})
	h.start(events.RunRequested{Prompt: "help", DeadlineMs: 9_300_000_000_000})
	deadline := h.timer(events.TimerRunDeadline)
	require.NotNil(t, deadline)
	assert.Equal(t, h.env.Now().Add(events.MaxRunDeadline), deadline.At, "the run's deadline is capped at a year")
}
