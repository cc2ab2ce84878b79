package bus_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// The dispatcher cancels an ended run's alarm by purging the run's
// schedule subjects from the timers stream: the server must then never
// fire it. A control schedule, due a second later and not purged, shows
// when the canceled one would have fired.
func TestAPurgedScheduleNeverFires(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx := ctxT(t)
	topo := bus.Topology{}
	s := topo.Subjects()
	timers, err := srv.JS.Stream(ctx, topo.StreamTimers())
	require.NoError(t, err)
	due := time.Now().UTC().Truncate(time.Second).Add(2 * time.Second)
	schedule := func(runID string, at time.Time) {
		m := &nats.Msg{Subject: s.Schedule(events.DefaultTenant, runID, "alarm"), Header: nats.Header{}, Data: []byte(`{}`)}
		m.Header.Set(bus.HeaderSchedule, "@at "+at.Format(time.RFC3339))
		m.Header.Set(bus.HeaderScheduleTarget, s.Run(events.DefaultTenant, runID, "timer"))
		_, err := srv.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	fired := func(runID string) int {
		return srv.Stored(t, topo.StreamTimers(), s.Run(events.DefaultTenant, runID, "timer"))
	}
	canceled, control := events.NewID(), events.NewID()
	schedule(canceled, due)
	schedule(control, due.Add(time.Second))
	before, err := timers.Info(ctx)
	require.NoError(t, err)
	require.NoError(t, timers.Purge(ctx, jetstream.WithPurgeSubject(s.Schedule(events.DefaultTenant, canceled, "*"))))
	after, err := timers.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, before.State.LastSeq, after.State.LastSeq, "a purge stores nothing")

	require.Eventually(t, func() bool { return fired(control) == 1 }, 10*time.Second, 20*time.Millisecond, "the control fires")
	assert.Zero(t, fired(canceled), "the purged schedule never fired")
}
