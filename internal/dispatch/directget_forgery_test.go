package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
)

// A direct get answers with a message's stored headers first and the
// server's own (Nats-Subject, Nats-Sequence, Nats-Time-Stamp) after them,
// and jetstreamext takes the first value of each. The deployed executor
// user may publish on a run's result subject with any header. These
// attacks (found by an attacker review of the direct-get log read,
// 2026-12-07) run as that user and as the deployed dispatcher user.

// deployedDispatcher starts a dispatcher connected as the deployed
// "dispatcher" user.
func deployedDispatcher(t *testing.T, srv *actionbustest.Server) *dispatch.Dispatcher {
	t.Helper()
	nc, err := nats.Connect(srv.UserURL("dispatcher"), nats.CustomInboxPrefix("_INBOX_dispatcher"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	d, err := dispatch.New(nc, dispatch.Config{InstanceID: "deployed"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("dispatcher: %v", err)
	}
	return d
}

// executorUser connects as the deployed executor user (pool default).
func executorUser(t *testing.T, srv *actionbustest.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.UserURL("executor"), nats.CustomInboxPrefix("_INBOX_executor"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func echoAction(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "test.echo"},
		func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: in}, nil
		})
}

// TestARunsLogIsReadAtTheSequencesTheServerGaveIt: a message on a run's
// result subject carrying "Nats-Sequence: 1" made the log read (a replay,
// a repair of an end, a retry's rebuild) start its next page at 2 for
// ever, appending the same events without bound. It is read at the
// sequence the server gave it, and the log read ends with the run's
// events.
func TestARunsLogIsReadAtTheSequencesTheServerGaveIt(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: echoAction})
	d := deployedDispatcher(t, srv)
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "test.echo", Args: map[string]any{"a": 1.0}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)

	ex := executorUser(t, srv)
	results := "ab.run.default." + res.RunID + ".result.*"
	before := srv.Stored(t, "AB_RUNS", results)
	require.NoError(t, ex.PublishMsg(&nats.Msg{Subject: "ab.run.default." + res.RunID + ".result",
		Header: nats.Header{"Nats-Sequence": {"1"}, "Nats-Time-Stamp": {"2000-01-01T00:00:00Z"}}, Data: []byte(`{}`)}))
	require.NoError(t, ex.Flush())
	require.Eventually(t, func() bool { return srv.Stored(t, "AB_RUNS", results) == before+1 }, 10*time.Second, 20*time.Millisecond,
		"the executor user stores on the run's result subject")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := d.ReplayLog(ctx, events.DefaultTenant, res.RunID)
	require.NoError(t, err, "the log read ends")
	assert.Equal(t, []string{events.TypeRunRequested, events.TypeActionCompleted}, rep.Events)
}

// TestAFollowerReadsARunsEventsAtTheSubjectsTheServerGaveThem: the read
// service pages a run's events with direct gets. An executor's
// run.completed of its own making, stored on the running run's result
// subject with "Nats-Subject: ab.run.<t>.<run>.completed", was handed to
// the run's follower as the run's end, with the executor's output. It is
// read at its stored subject (a result's, which its type does not bind),
// and the follower sees the run's real end.
func TestAFollowerReadsARunsEventsAtTheSubjectsTheServerGaveThem(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	release := make(chan struct{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.gated"},
			func(ctx context.Context, _ map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return executor.Result[map[string]any]{Output: map[string]any{"genuine": true}}, nil
			})
	}})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.gated", Args: map[string]any{}}})
	require.NoError(t, err)

	e := event.New()
	e.SetID(events.NewID())
	e.SetType(events.TypeRunCompleted)
	e.SetSource("actionbus/dispatcher")
	e.SetTime(time.Now())
	e.SetExtension(events.ExtRunID, runID)
	e.SetExtension(events.ExtTenant, events.DefaultTenant)
	require.NoError(t, events.SetData(&e, events.ContentTypeJSON, &events.RunCompleted{RunID: runID, Output: map[string]any{"forged": "by an executor"}}))
	completed := "ab.run.default." + runID + ".completed"
	msg, err := bus.Encode(completed, &e, bus.ModeBinary)
	require.NoError(t, err)
	msg.Subject = "ab.run.default." + runID + ".result" // what the executor may publish on
	msg.Header.Set("Nats-Subject", completed)
	ex := executorUser(t, srv)
	require.NoError(t, ex.PublishMsg(msg))
	require.NoError(t, ex.Flush())
	require.Eventually(t, func() bool { return srv.Stored(t, "AB_RUNS", "ab.run.default."+runID+".result.*") == 1 },
		10*time.Second, 20*time.Millisecond, "the executor user stores on the run's result subject")

	// The follower pages the running run's stored events, the forged end
	// among them: before the fix it returned that end at once. The run is
	// let end once the follower has seen an event, or after 2 s (a gated
	// run may have none to show before its end); either way its end is
	// the executor's genuine output.
	followed := make(chan struct{})
	go func() {
		select {
		case <-followed:
		case <-time.After(2 * time.Second):
		}
		close(release)
	}()
	res, err := st.Client.Follow(ctx, runID, func(client.Event) {
		select {
		case <-followed:
		default:
			close(followed)
		}
	})
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"genuine": true}, res.Output, "the follower took the executor's forged end for the run's")
}
