package bus_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

func newBus(t *testing.T, srv *actionbustest.Server, mode bus.Mode, ct string) *bus.Bus {
	t.Helper()
	eb, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/actionbus/test", Mode: mode, DataContentType: ct})
	require.NoError(t, err)
	srv.ServeIngress(t) // client events reach the requests stream through it
	return eb
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRepublishedEventIsStoredOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	runID := events.NewID()
	e, err := eb.New(events.TypeRunRequested, runID, events.DefaultTenant, runID, &events.RunRequested{RunID: runID, Prompt: "hi"})
	require.NoError(t, err)
	subject := eb.Subjects().Run(events.DefaultTenant, runID, "requested")

	first, err := eb.Publish(ctx, subject, e)
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	second, err := eb.Publish(ctx, subject, e)
	require.NoError(t, err)
	assert.True(t, second.Duplicate)
	assert.Equal(t, first.Sequence, second.Sequence)

	stream, err := srv.JS.Stream(ctx, bus.Topology{}.StreamRequests())
	require.NoError(t, err)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.State.Msgs)
}

func TestTerminalEventsShareOneID(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	runID := events.NewID()
	terminalID := events.DerivedID(runID, "run-secret", "terminal")
	_, err := eb.Emit(ctx, events.TypeRunCompleted, terminalID, events.DefaultTenant, runID, "", &events.RunCompleted{RunID: runID, Cycles: 1})
	require.NoError(t, err)
	_, err = eb.Emit(ctx, events.TypeRunFailed, terminalID, events.DefaultTenant, runID, "", &events.RunFailed{RunID: runID, Error: actionbus.Error{Code: "x"}})
	require.NoError(t, err)
	stream, err := srv.JS.Stream(ctx, bus.Topology{}.StreamRuns())
	require.NoError(t, err)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(eb.Subjects().RunEvents(events.DefaultTenant, runID)))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.State.Msgs, "a run stores at most one terminal event")
}

func TestPublishedEventsReachConsumersInBothModesAndCodecs(t *testing.T) {
	for _, mode := range []bus.Mode{bus.ModeBinary, bus.ModeStructured} {
		for _, ct := range []string{events.ContentTypeJSON, events.ContentTypeMsgpack} {
			t.Run(mode.String()+"/"+ct, func(t *testing.T) {
				srv := actionbustest.NewServer(t, actionbustest.Options{})
				eb := newBus(t, srv, mode, ct)
				ctx := ctxT(t)
				runID := events.NewID()
				want := &events.RunRequested{RunID: runID, Prompt: "grüße 100 %", Scenario: "demo", AllowedModes: []string{"read"}}
				_, err := eb.Emit(ctx, events.TypeRunRequested, runID, events.DefaultTenant, runID, "", want)
				require.NoError(t, err)

				got := make(chan *events.Received, 1)
				serve(t, srv, eb, bus.ConsumerDispatcherRequests, func(ctx context.Context, r *events.Received, _ jetstream.Msg) error {
					got <- r
					return nil
				})
				select {
				case r := <-got:
					assert.Equal(t, want, r.Data)
					assert.Equal(t, runID, r.RunID())
				case <-ctx.Done():
					t.Fatal("event not consumed")
				}
			})
		}
	}
}

// serve runs bus.Serve on a durable consumer until the test ends.
func serve(t *testing.T, srv *actionbustest.Server, eb *bus.Bus, consumer string, h bus.HandlerFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream := bus.Topology{}.StreamRuns()
	if consumer == bus.ConsumerDispatcherRequests {
		stream = bus.Topology{}.StreamRequests()
	}
	cons, err := srv.JS.Consumer(ctx, stream, bus.PartitionConsumer(consumer, 0))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		done <- eb.Serve(ctx, cons, bus.ServeOptions{Name: consumer, Concurrency: 4, PriorityGroup: bus.OwnerGroup}, h)
	}()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
}

func TestBadEventsAreRejectedAndConsumingGoesOn(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	rec := srv.Record(t, "")
	subjects := eb.Subjects()

	validHeaders := func(id, typ string) nats.Header {
		return nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {id}, "ce-source": {"/test"}, "ce-type": {typ},
			"ce-datacontenttype": {"application/json"}, bus.HeaderMsgID: {id},
		}
	}
	r1, r2, r3, r4, r5, r6 := events.NewID(), events.NewID(), events.NewID(), events.NewID(), events.NewID(), events.NewID()
	// A message at the server's max payload, headers included: its
	// rejection, which keeps the original, must still fit in one.
	huge := []byte(`{"runId":"` + r6 + `","pad":"` + strings.Repeat("<", 960_000) + `"}`)
	truncated, err := msgpack.Marshal(map[string]any{"runId": r5, "kind": "agent"})
	require.NoError(t, err)

	bad := []struct {
		name   string
		runID  string
		header nats.Header
		body   []byte
		code   actionbus.Code
	}{
		{"malformed headers", r1, nats.Header{"ce-specversion": {"1.0"}, "ce-id": {"%ZZ"}, bus.HeaderMsgID: {"m1"}}, []byte(`{}`), actionbus.CodeMalformedEvent},
		{"unknown type", r2, validHeaders("m2", "io.actionbus.nope.happened"), []byte(`{}`), actionbus.CodeUnknownEventType},
		{"data violating its schema", r3, validHeaders("m3", events.TypeDecisionMade), []byte(`{"runId":"` + r3 + `"}`), actionbus.CodeSchemaValidation},
		{"wrong datacontenttype", r4, func() nats.Header {
			h := validHeaders("m4", events.TypeDecisionMade)
			h["ce-datacontenttype"] = []string{"text/csv"}
			return h
		}(), []byte(`a,b`), actionbus.CodeUnsupportedContent},
		{"truncated msgpack", r5, func() nats.Header {
			h := validHeaders("m5", events.TypeDecisionMade)
			h["ce-datacontenttype"] = []string{events.ContentTypeMsgpack}
			return h
		}(), truncated[:len(truncated)-2], actionbus.CodeMalformedEvent},
		{"a message at the max payload", r6, func() nats.Header {
			h := validHeaders("m6", events.TypeDecisionMade)
			h["X-Pad"] = []string{strings.Repeat("h", 60_000)}
			return h
		}(), huge, actionbus.CodeSchemaValidation},
	}
	for _, b := range bad {
		_, err := srv.JS.PublishMsg(ctx, &nats.Msg{Subject: subjects.Run(events.DefaultTenant, b.runID, "decision"), Header: b.header, Data: b.body})
		require.NoError(t, err, b.name)
	}
	runID := events.NewID()
	decision := &events.DecisionMade{RunID: runID, Cycle: 1, Decision: events.Decision{Type: "final", Answer: "ok"}}
	_, err = eb.Emit(ctx, events.TypeDecisionMade, events.DerivedID(runID, "decision", 1), events.DefaultTenant, runID, "", decision)
	require.NoError(t, err)

	var mu sync.Mutex
	var handled []string
	validSeen := make(chan struct{})
	serve(t, srv, eb, bus.ConsumerDispatcher, func(ctx context.Context, r *events.Received, _ jetstream.Msg) error {
		mu.Lock()
		handled = append(handled, r.RunID())
		mu.Unlock()
		close(validSeen)
		return nil
	})
	select {
	case <-validSeen:
	case <-ctx.Done():
		t.Fatal("the valid event after the bad ones was not consumed")
	}

	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
				return r.Type() == events.TypeEventRejected && r.Subject == subjects.Rejected("AB_RUNS") &&
					r.Event != nil && events.DataAs(r.Event, new(events.EventRejected)) == nil && rejectedRun(r) == b.runID
			})
			var rej events.EventRejected
			require.NoError(t, events.DataAs(r.Event, &rej))
			assert.Equal(t, b.code, rej.Reason.Code, rej.Reason.Message)
			assert.NotEmpty(t, rej.Reason.Message)
			assert.Equal(t, subjects.Run(events.DefaultTenant, b.runID, "decision"), rej.OriginalSubject)
			if len(b.body) <= bus.MaxRejectedData {
				assert.Equal(t, b.body, rej.OriginalData)
				assert.Zero(t, rej.OriginalDataBytes)
			} else {
				sum := sha256.Sum256(b.body)
				assert.Equal(t, b.body[:bus.MaxRejectedData], rej.OriginalData, "the body's head")
				assert.Equal(t, len(b.body), rej.OriginalDataBytes)
				assert.Equal(t, hex.EncodeToString(sum[:]), rej.OriginalDataHash)
			}
			for _, v := range rej.OriginalHeaders {
				for _, s := range v {
					assert.LessOrEqual(t, len(s), bus.MaxRejectedHeader+len("…"))
				}
			}
			assert.Equal(t, b.header[bus.HeaderMsgID], rej.OriginalHeaders[bus.HeaderMsgID])
			assert.NotEqual(t, b.header.Get(bus.HeaderMsgID), r.Event.ID(), "rejected events get a new id")
			assert.Equal(t, "dispatcher", rej.Consumer)
			assert.NotZero(t, rej.StreamSequence)
		})
	}
	mu.Lock()
	assert.Equal(t, []string{runID}, handled, "only the valid event reaches the handler")
	mu.Unlock()

	// Every message was acked: nothing is left pending or to redeliver.
	cons, err := srv.JS.Consumer(ctx, "AB_RUNS", bus.PartitionConsumer(bus.ConsumerDispatcher, 0))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.NumRedelivered == 0
	}, 10*time.Second, 10*time.Millisecond, "a message was left unacknowledged")
}

func rejectedRun(r actionbustest.Recorded) string {
	var rej events.EventRejected
	if events.DataAs(r.Event, &rej) != nil {
		return ""
	}
	return rej.RunID
}

// TestRejectionSpeaksForNoRun: rejecting a run.requested publishes the
// rejection under a fresh id and no run event (the dispatcher decides in
// OnReject whether the run can be failed), and OnReject sees the reason.
func TestRejectionSpeaksForNoRun(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	rec := srv.Record(t, "")
	runID := events.NewID()
	_, err := srv.JS.PublishMsg(ctx, &nats.Msg{
		Subject: eb.Subjects().Run(events.DefaultTenant, runID, "requested"),
		Header: nats.Header{"ce-specversion": {"1.0"}, "ce-id": {runID}, "ce-source": {"/client"},
			"ce-type": {events.TypeRunRequested}, "ce-datacontenttype": {"application/json"},
			bus.HeaderMsgID: {runID}},
		Data: []byte(`{"runId":"` + runID + `","allowedModes":"everything"}`),
	})
	require.NoError(t, err)
	reasons := make(chan error, 1)
	cons, err := srv.JS.Consumer(ctx, bus.Topology{}.StreamRequests(), bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0))
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- eb.Serve(sctx, cons, bus.ServeOptions{Name: "dispatcher-requests", PriorityGroup: bus.OwnerGroup, OnReject: func(_ context.Context, msg jetstream.Msg, reason error) error {
			reasons <- reason
			return nil
		}}, func(context.Context, *events.Received, jetstream.Msg) error {
			t.Error("an invalid run.requested reached the handler")
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case reason := <-reasons:
		assert.ErrorIs(t, reason, actionbus.ErrSchemaValidation)
	case <-ctx.Done():
		t.Fatal("OnReject was not called")
	}
	r := rec.WaitForType(t, 0, events.TypeEventRejected, "")
	assert.NotEqual(t, runID, r.Event.ID(), "a rejection has its own id")
	assert.Equal(t, runID, rejectedRun(r))
	for _, got := range rec.All() {
		assert.NotEqual(t, events.TypeRunFailed, got.Type(), "the rejecter published a run event")
	}
}

func TestHandlerErrorsAreRetriedAndPermanentOnesTerminated(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	transient, permanent := events.NewID(), events.NewID()
	for _, id := range []string{transient, permanent} {
		_, err := eb.Emit(ctx, events.TypeDecisionMade, events.DerivedID(id, "decision"), events.DefaultTenant, id, "", &events.DecisionMade{RunID: id, Cycle: 1, Decision: events.Decision{Type: "final", Answer: "ok"}})
		require.NoError(t, err)
	}
	var mu sync.Mutex
	deliveries := map[string]int{}
	retried := make(chan struct{})
	serve(t, srv, eb, bus.ConsumerDispatcher, func(ctx context.Context, r *events.Received, _ jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		deliveries[r.RunID()]++
		switch {
		case r.RunID() == permanent:
			return bus.Permanent(assert.AnError)
		case deliveries[r.RunID()] == 1:
			return assert.AnError
		default:
			close(retried)
			return nil
		}
	})
	select {
	case <-retried:
	case <-ctx.Done():
		t.Fatal("a transient handler error was not retried")
	}
	cons, err := srv.JS.Consumer(ctx, "AB_RUNS", bus.PartitionConsumer(bus.ConsumerDispatcher, 0))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 10*time.Second, 20*time.Millisecond)
	mu.Lock()
	assert.Equal(t, 1, deliveries[permanent], "a permanent error is not redelivered")
	assert.Equal(t, 2, deliveries[transient])
	mu.Unlock()
}

// A service's bus leaves the data-schema check to the receiver (the trust
// boundary): its own events are checked once, where they are received.
// The dispatcher's events are the exception: only the dispatcher may
// publish them, from data it validated, so their receivers check their
// envelope and decode them, and a test binary checks them at publish.
func TestDataIsValidatedOnceAtTheReceiver(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx := ctxT(t)
	runID := events.NewID()
	bad := &events.DecisionMade{RunID: runID} // a decision is required by its schema
	subject := srv.Prefix + ".run." + events.DefaultTenant + "." + runID + ".decision"

	client := newBus(t, srv, bus.ModeBinary, "")
	e, err := client.New(events.TypeDecisionMade, events.NewID(), events.DefaultTenant, runID, bad)
	require.NoError(t, err)
	_, err = client.Publish(ctx, subject, e)
	require.ErrorIs(t, err, actionbus.ErrSchemaValidation, "a client's bus checks what it publishes")

	service, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/actionbus/test-service", ReceiverValidates: true})
	require.NoError(t, err)
	ack, err := service.Publish(ctx, subject, e)
	require.NoError(t, err)
	msg, err := srv.JS.Stream(ctx, bus.Topology{}.StreamRuns())
	require.NoError(t, err)
	stored, err := msg.GetMsg(ctx, ack.Sequence)
	require.NoError(t, err)
	_, err = service.Receive(stored.Subject, stored.Header, stored.Data)
	require.ErrorIs(t, err, actionbus.ErrSchemaValidation, "the receiver refuses it")

	// A dispatcher's event: checked at publish here (a test binary)...
	step, err := service.New(events.TypeRunStep, events.NewID(), events.DefaultTenant, runID, &events.RunStep{RunID: runID})
	require.NoError(t, err)
	stepSubject := srv.Prefix + ".run." + events.DefaultTenant + "." + runID + ".step"
	_, err = service.Publish(ctx, stepSubject, step)
	require.ErrorIs(t, err, actionbus.ErrSchemaValidation, "a test binary checks the dispatcher's events at publish")
	// ...and received on its envelope, type, binding and typed decoding.
	msgOut, err := bus.Encode(stepSubject, step, bus.ModeBinary)
	require.NoError(t, err)
	got, err := service.Receive(msgOut.Subject, msgOut.Header, msgOut.Data)
	require.NoError(t, err, "the dispatcher's events are not checked against their schema again")
	assert.Equal(t, runID, got.Data.(*events.RunStep).RunID)
	_, err = service.Receive(stepSubject, msgOut.Header, []byte(`{"runId": 7}`))
	require.ErrorIs(t, err, actionbus.ErrMalformedEvent, "data that does not decode is refused")
}

// With OrderBy, a run's events are handled one after another in stream
// order, while other runs' events run beside them.
func TestServeOrderByKeepsEachRunInOrder(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	runs := []string{events.NewID(), events.NewID()}
	const per = 40
	for i := 0; i < per; i++ {
		for _, runID := range runs {
			_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "",
				&events.RunRequested{RunID: runID, Prompt: strconv.Itoa(i)})
			require.NoError(t, err)
		}
	}
	cons, err := srv.JS.Consumer(ctx, bus.Topology{}.StreamRequests(), bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0))
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[string][]int{}
	inFlight := map[string]int{}
	overlapped := false
	all := make(chan struct{})
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- eb.Serve(sctx, cons, bus.ServeOptions{Name: "ordered", PriorityGroup: bus.OwnerGroup, Concurrency: 8, OrderBy: eb.Subjects().RunIDFromSubject},
			func(_ context.Context, r *events.Received, _ jetstream.Msg) error {
				req := r.Data.(*events.RunRequested)
				mu.Lock()
				inFlight[req.RunID]++
				overlapped = overlapped || inFlight[req.RunID] > 1
				mu.Unlock()
				runtime.Gosched() // give a concurrent handler of the same run its chance
				i, _ := strconv.Atoi(req.Prompt)
				mu.Lock()
				inFlight[req.RunID]--
				seen[req.RunID] = append(seen[req.RunID], i)
				if len(seen[runs[0]])+len(seen[runs[1]]) == 2*per {
					close(all)
				}
				mu.Unlock()
				return nil
			})
	}()
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatal("not every event was handled")
	}
	cancel()
	require.NoError(t, <-done)
	assert.False(t, overlapped, "two events of one run were handled at once")
	for _, runID := range runs {
		assert.True(t, slices.IsSorted(seen[runID]), "run %s handled out of order: %v", runID, seen[runID])
	}
}

// A handler that answers Later frees its slot at once: the next messages
// of the same ordered key are handled while the earlier ones wait, and
// each is settled by what its channel receives — nil acks, an error
// redelivers.
// A handler that keeps failing transiently — a stream leader being
// elected for longer than its first naks last — keeps its event: it is
// delivered again until the handler succeeds. Consumers allowed five
// deliveries (naks of 0.1 to 0.8 s, 1.5 s in all), and the server then
// dropped the event.
func TestServeRetriesATransientFailureUntilItPasses(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	runID := events.NewID()
	_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "",
		&events.RunRequested{RunID: runID, Prompt: "through a failover"})
	require.NoError(t, err)
	cons, err := srv.JS.Consumer(ctx, bus.Topology{}.StreamRequests(), bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0))
	require.NoError(t, err)
	const failures = 8
	handled := make(chan uint64, 1)
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- eb.Serve(sctx, cons, bus.ServeOptions{Name: "failover", PriorityGroup: bus.OwnerGroup, Concurrency: 1, NakDelay: time.Millisecond},
			func(_ context.Context, _ *events.Received, msg jetstream.Msg) error {
				md, err := msg.Metadata()
				if err != nil {
					return err
				}
				if md.NumDelivered <= failures {
					return errors.New("stream leader being elected")
				}
				handled <- md.NumDelivered
				return nil
			})
	}()
	select {
	case n := <-handled:
		assert.Equal(t, uint64(failures+1), n)
	case <-ctx.Done():
		info, _ := cons.Info(context.Background())
		t.Fatalf("the event was dropped after failed deliveries; consumer: %+v", info)
	}
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 10*time.Second, 5*time.Millisecond, "acked")
	cancel()
	require.NoError(t, <-served)
}

// An event whose last allowed delivery fails is not dropped in silence:
// Serve says so once, at error level, naming it.
func TestServeLogsAnEventItsServerWillNotDeliverAgain(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var logs actionbustest.LogBuffer
	srv.ServeIngress(t)
	eb, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/actionbus/test", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ctx := ctxT(t)
	runID := events.NewID()
	id := events.NewID()
	_, err = eb.Emit(ctx, events.TypeRunRequested, id, events.DefaultTenant, runID, "", &events.RunRequested{RunID: runID})
	require.NoError(t, err)
	cons, err := srv.JS.CreateConsumer(ctx, bus.Topology{}.StreamRequests(), jetstream.ConsumerConfig{
		Durable: "twice", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 2})
	require.NoError(t, err)
	deliveries := make(chan uint64, 4)
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- eb.Serve(sctx, cons, bus.ServeOptions{Name: "twice", NakDelay: time.Millisecond},
			func(_ context.Context, _ *events.Received, msg jetstream.Msg) error {
				md, _ := msg.Metadata()
				deliveries <- md.NumDelivered
				return errors.New("unreachable bucket")
			})
	}()
	for want := uint64(1); want <= 2; want++ {
		select {
		case n := <-deliveries:
			require.Equal(t, want, n)
		case <-ctx.Done():
			t.Fatal("not delivered")
		}
	}
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "will not be delivered again") }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-served)
	line := logs.String()
	assert.Equal(t, 1, strings.Count(line, "will not be delivered again"), line)
	assert.Contains(t, line, "level=ERROR")
	assert.Contains(t, line, "id="+id)
	assert.Contains(t, line, "deliveries=2")
}

func TestServeSettlesLaterAnswersByWhatTheyReceive(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	runID := events.NewID()
	const n = 3
	for i := 0; i < n; i++ {
		_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "",
			&events.RunRequested{RunID: runID, Prompt: strconv.Itoa(i)})
		require.NoError(t, err)
	}
	cons, err := srv.JS.Consumer(ctx, bus.Topology{}.StreamRequests(), bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0))
	require.NoError(t, err)
	type taken struct {
		prompt    string
		delivered uint64
		done      chan error
	}
	took := make(chan taken, 2*n)
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- eb.Serve(sctx, cons, bus.ServeOptions{Name: "later", PriorityGroup: bus.OwnerGroup, Concurrency: 1, NakDelay: time.Millisecond, OrderBy: eb.Subjects().RunIDFromSubject},
			func(_ context.Context, r *events.Received, msg jetstream.Msg) error {
				md, err := msg.Metadata()
				require.NoError(t, err)
				done := make(chan error, 1)
				took <- taken{r.Data.(*events.RunRequested).Prompt, md.NumDelivered, done}
				return bus.Later(done)
			})
	}()
	next := func() taken {
		select {
		case x := <-took:
			return x
		case <-ctx.Done():
			t.Fatalf("no message handled; consumer: %+v", func() any { i, _ := cons.Info(context.Background()); return i }())
			return taken{}
		}
	}
	// All three are taken by one slot before any is settled.
	var first []taken
	for i := 0; i < n; i++ {
		first = append(first, next())
		assert.Equal(t, strconv.Itoa(i), first[i].prompt, "in order")
	}
	first[0].done <- nil
	first[1].done <- errors.New("not stored yet")
	first[2].done <- nil
	again := next()
	assert.Equal(t, "1", again.prompt, "the failed one is redelivered")
	assert.Equal(t, uint64(2), again.delivered)
	again.done <- nil
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 10*time.Second, 5*time.Millisecond, "every message acked")
	cancel()
	require.NoError(t, <-served)
	select {
	case x := <-took:
		t.Fatalf("message %s handled again after it was acked", x.prompt)
	default:
	}
}

// recordingSettler is an [bus.AckAllSettler] that acknowledges nothing
// and notes what Serve tells it.
type recordingSettler struct {
	mu   sync.Mutex
	took []string
	done []string
	fail []string
}

func promptOf(msg jetstream.Msg) string {
	e, err := bus.Decode(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		return ""
	}
	var req events.RunRequested
	_ = events.DataAs(e, &req)
	return req.Prompt
}

func (r *recordingSettler) Take(msg jetstream.Msg) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.took = append(r.took, promptOf(msg))
	return promptOf(msg) != "skip"
}

func (r *recordingSettler) Done(msg jetstream.Msg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = append(r.done, promptOf(msg))
}

func (r *recordingSettler) Failed(msg jetstream.Msg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = append(r.fail, promptOf(msg))
}

// On an ack-all consumer an acknowledgement or a termination covers every
// message before it, so Serve leaves them to the consumer's settler: a
// handled message, a permanent failure and a failure on the last delivery
// are Done, a retried one Failed (and nak'd), a message the settler does
// not Take is not handled; Serve itself never moves the ack floor.
func TestServeLeavesAnAckAllConsumersAcknowledgementsToItsSettler(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	prompts := []string{"ok", "permanent", "skip", "retry"}
	for _, p := range prompts {
		runID := events.NewID()
		_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "", &events.RunRequested{RunID: runID, Prompt: p})
		require.NoError(t, err)
	}
	cons, err := srv.JS.CreateConsumer(ctx, bus.Topology{}.StreamRequests(), jetstream.ConsumerConfig{
		Durable: "all", AckPolicy: jetstream.AckAllPolicy, MaxDeliver: 2})
	require.NoError(t, err)
	settler := &recordingSettler{}
	handled := make(chan string, 8)
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- eb.Serve(sctx, cons, bus.ServeOptions{Name: "all", NakDelay: time.Millisecond, AckAll: settler},
			func(_ context.Context, r *events.Received, _ jetstream.Msg) error {
				p := r.Data.(*events.RunRequested).Prompt
				handled <- p
				switch p {
				case "permanent":
					return bus.Permanent(errors.New("never"))
				case "retry":
					return errors.New("not now")
				}
				return nil
			})
	}()
	var got []string
	for len(got) < 4 {
		select {
		case p := <-handled:
			got = append(got, p)
		case <-ctx.Done():
			t.Fatalf("handled only %v", got)
		}
	}
	assert.Equal(t, []string{"ok", "permanent", "retry", "retry"}, got, "the skipped one is not handled; the retried one twice")
	require.Eventually(t, func() bool {
		settler.mu.Lock()
		defer settler.mu.Unlock()
		return len(settler.done) == 3
	}, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-served)
	settler.mu.Lock()
	assert.Equal(t, []string{"ok", "permanent", "skip", "retry", "retry"}, settler.took)
	assert.ElementsMatch(t, []string{"ok", "permanent", "retry"}, settler.done, "the last delivery's failure is done")
	assert.Equal(t, []string{"retry"}, settler.fail, "the first failure is retried")
	settler.mu.Unlock()
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.AckFloor.Stream, "Serve acknowledged or terminated nothing itself")
}

// TestRevisionConflictsAreKnownOnOneReplica: a create of a key that exists
// and an update at a stale revision are conflicts, whatever error form
// the client library gives them; a missing bucket is not.
func TestRevisionConflictsAreKnownOnOneReplica(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx := ctxT(t)
	kv, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "conflicts"})
	require.NoError(t, err)
	rev, err := kv.Create(ctx, "k", []byte("1"))
	require.NoError(t, err)
	_, err = kv.Update(ctx, "k", []byte("2"), rev)
	require.NoError(t, err)

	_, err = kv.Create(ctx, "k", []byte("x"))
	assert.True(t, bus.IsRevisionConflict(err), "create of an existing key: %v", err)
	_, err = kv.Update(ctx, "k", []byte("x"), rev)
	assert.True(t, bus.IsRevisionConflict(err), "update at a stale revision: %v", err)
	assert.True(t, bus.IsRevisionConflict(bus.PutRevision(ctx, kv, "k", []byte("x"), rev)))
	_, err = srv.JS.KeyValue(ctx, "no-such-bucket")
	assert.False(t, bus.IsRevisionConflict(err), "a missing bucket: %v", err)
}

// A Serve that stops with events fetched and not yet handled hands them
// back: the consumer's next client receives them at once, not after the
// ack wait (a partition handed to another dispatcher).
func TestAStoppedServeHandsBackTheEventsItFetched(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx, cancelAll := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancelAll()
	const sent, concurrency = 8, 4
	want := map[string]bool{}
	for range sent {
		runID := events.NewID()
		_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "", &events.RunRequested{RunID: runID})
		require.NoError(t, err)
		want[runID] = true
	}
	// An ack wait far beyond the test's deadline: only a hand-back
	// redelivers in time.
	cons, err := srv.JS.CreateConsumer(ctx, bus.Topology{}.StreamRequests(), jetstream.ConsumerConfig{
		Durable: "handback", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Minute})
	require.NoError(t, err)

	// The first client's handlers hold every slot until it stops, and it
	// fetches ahead of them.
	started := make(chan struct{}, sent)
	firstCtx, stopFirst := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() {
		first <- eb.Serve(firstCtx, cons, bus.ServeOptions{Name: "first", Concurrency: concurrency},
			func(ctx context.Context, _ *events.Received, _ jetstream.Msg) error {
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			})
	}()
	for range concurrency {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the first client handled nothing")
		}
	}
	// The deadline is generous: under make test's load (every package
	// at once, -race, on two cores) the refill pull and the consumer's
	// info answer have taken over 10 s.
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending > concurrency
	}, 30*time.Second, 5*time.Millisecond, "the first client fetched events it has no slot for")
	stopFirst()
	require.NoError(t, <-first)
	assert.Len(t, started, 0, "a stopped client starts nothing it fetched")

	nextCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	handled := make(chan string, 2*sent)
	next := make(chan error, 1)
	go func() {
		next <- eb.Serve(nextCtx, cons, bus.ServeOptions{Name: "next", Concurrency: sent},
			func(_ context.Context, r *events.Received, _ jetstream.Msg) error {
				handled <- r.RunID()
				return nil
			})
	}()
	got := map[string]bool{}
	for len(got) < sent {
		select {
		case runID := <-handled:
			got[runID] = true
		case <-nextCtx.Done():
			t.Fatalf("the next client received %d of %d events within 30 s (ack wait 10 min)", len(got), sent)
		}
	}
	assert.Equal(t, want, got)
	cancel()
	require.NoError(t, <-next)
}

// An event a stopped client fetched on its last delivery is never
// delivered again, handed back or not: the client says so, once per
// event, at error level, as it does for a handler that fails on its last
// delivery.
func TestAnEventHandedBackOnItsLastDeliveryIsLogged(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var logged lockedBuffer
	eb, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/actionbus/test", Logger: slog.New(slog.NewJSONHandler(&logged, nil))})
	require.NoError(t, err)
	srv.ServeIngress(t)
	ctx := ctxT(t)
	const sent, concurrency = 12, 4
	for range sent {
		runID := events.NewID()
		_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "", &events.RunRequested{RunID: runID})
		require.NoError(t, err)
	}
	cons, err := srv.JS.CreateConsumer(ctx, bus.Topology{}.StreamRequests(), jetstream.ConsumerConfig{
		Durable: "lastdelivery", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Minute, MaxDeliver: 1})
	require.NoError(t, err)
	started := make(chan struct{}, sent)
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- eb.Serve(serveCtx, cons, bus.ServeOptions{Name: "first", Concurrency: concurrency},
			func(ctx context.Context, _ *events.Received, _ jetstream.Msg) error {
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			})
	}()
	for range concurrency {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the client handled nothing")
		}
	}
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending > concurrency
	}, 10*time.Second, 5*time.Millisecond, "the client fetched events it has no slot for")
	stop()
	require.NoError(t, <-done)
	// The events started are their handlers' to settle; every other one
	// fetched (at least one, at most all the others) is handed back.
	n := strings.Count(logged.String(), "was never handled (the client stopped)")
	assert.True(t, n >= 1 && n <= sent-concurrency, "each event fetched on its last delivery and handed back is logged once (%d lines): %s", n, logged.String())
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// With Linger, Serve pulls in bursts of at most LingerBatch: every event
// is handled, in order per key, those stored while it lingers too, each
// acknowledged; an idle Serve leaves one pull request waiting at the
// server (not a no-wait fetch per linger) and hands out the event stored
// next; and a Serve waiting idle stops when asked, before its pull expires.
func TestServeWithLingerHandlesEveryEventInBursts(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb := newBus(t, srv, bus.ModeBinary, "")
	ctx := ctxT(t)
	stream := bus.Topology{}.StreamRequests()
	cons, err := srv.JS.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "lingering", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	runs := []string{events.NewID(), events.NewID()}
	emit := func(from, to int) {
		for i := from; i < to; i++ {
			runID := runs[i%2]
			_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "", &events.RunRequested{RunID: runID, Prompt: strconv.Itoa(i)})
			require.NoError(t, err)
		}
	}
	emit(0, 10) // more than a burst
	var mu sync.Mutex
	seen := map[string][]int{}
	handled := 0
	reached := map[int]chan struct{}{10: make(chan struct{}), 15: make(chan struct{}), 16: make(chan struct{})}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- eb.Serve(sctx, cons, bus.ServeOptions{Name: "lingering", Concurrency: 4, OrderBy: eb.Subjects().RunIDFromSubject, Linger: 20 * time.Millisecond, LingerBatch: 4, PullExpiry: time.Hour},
			func(_ context.Context, r *events.Received, _ jetstream.Msg) error {
				req := r.Data.(*events.RunRequested)
				i, _ := strconv.Atoi(req.Prompt)
				mu.Lock()
				defer mu.Unlock()
				seen[req.RunID] = append(seen[req.RunID], i)
				handled++
				if c, ok := reached[handled]; ok {
					close(c)
				}
				return nil
			})
	}()
	awaitHandled := func(n int) {
		t.Helper()
		select {
		case <-reached[n]:
		case <-ctx.Done():
			t.Fatalf("%d events handled, not %d", handled, n)
		}
	}
	awaitHandled(10)
	emit(10, 15) // stored while Serve lingers
	awaitHandled(15)
	idle := func() bool {
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		return info.NumWaiting == 1
	}
	require.Eventually(t, idle, 10*time.Second, 5*time.Millisecond, "an idle Serve leaves one pull request waiting")
	emit(15, 16)
	awaitHandled(16)
	require.Eventually(t, idle, 10*time.Second, 5*time.Millisecond, "Serve waits idle again")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Serve did not stop while waiting idle")
	}
	for _, runID := range runs {
		assert.True(t, slices.IsSorted(seen[runID]), "run %s handled out of order: %v", runID, seen[runID])
	}
	// Acknowledgements are sent without waiting for the server's answer.
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		return info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream == info.Delivered.Stream
	}, 10*time.Second, 10*time.Millisecond, "every event pulled and acknowledged")
}
