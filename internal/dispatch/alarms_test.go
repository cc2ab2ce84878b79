package dispatch_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// A run's alarm watches its deadlines while it runs; once its end is
// published, the dispatcher purges the run's schedule, so the alarm never
// fires half a minute later for a run that is over.
func TestAnEndedRunsAlarmIsCanceledARunningOnesIsKept(t *testing.T) {
	srv, rec, st, w, _ := startHolding(t)
	ctx := ctxT(t)
	topo := bus.Topology{}
	schedules := func(runID string) int {
		return srv.Stored(t, topo.StreamTimers(), topo.Subjects().Schedule(events.DefaultTenant, runID, "*"))
	}
	runID := fanOut(t, ctx, srv, rec, st, w)
	// Its work goes out ahead of its alarm (run.WorkFirst): the alarm is
	// stored with the same publish batch, maybe after the work started.
	require.Eventually(t, func() bool { return schedules(runID) == 1 }, 10*time.Second, 5*time.Millisecond,
		"a running run's alarm is armed")
	for range 4 {
		w.gate <- struct{}{}
	}
	finishFanOut(t, ctx, st, w, runID)
	require.Eventually(t, func() bool { return schedules(runID) == 0 }, 10*time.Second, 5*time.Millisecond,
		"the ended run's alarm is canceled")
}
