package conformance_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/conformance"
)

// runClientKit runs the client kit on srv and starts the client under
// test (start) once the kit listens.
func runClientKit(t *testing.T, srv *actionbustest.Server, start func(ctx context.Context)) []conformance.Row {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	listening, started := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(started)
		<-listening
		start(ctx)
	}()
	rows, err := conformance.RunClient(ctx, srv.Connect(t), conformance.ClientConfig{Wait: 10 * time.Second, Listening: func() { close(listening) }})
	require.NoError(t, err)
	<-started
	return rows
}

// The Go client's run.requested passes every C-START check.
func TestTheGoClientPassesTheClientKit(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.ServeIngress(t)
	c, err := client.New(srv.Connect(t), client.Options{})
	require.NoError(t, err)
	rows := runClientKit(t, srv, func(ctx context.Context) {
		_, err := c.Start(ctx, client.RunRequest{Prompt: "conformance"})
		assert.NoError(t, err)
	})
	require.Len(t, rows, 4)
	for _, r := range rows {
		assert.NoError(t, r.Err, "%s %s", r.Rule, r.Case)
	}
}

// A client whose start event has a fresh id (a retried start would be
// stored twice) fails that check, and only that one.
func TestTheClientKitFailsAStartWithAFreshEventID(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	b, err := bus.Open(srv.Connect(t), bus.BusConfig{Source: "/broken-client"})
	require.NoError(t, err)
	rows := runClientKit(t, srv, func(ctx context.Context) {
		runID := events.NewID()
		e, err := b.New(events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, &events.RunRequested{RunID: runID, Prompt: "conformance"})
		if !assert.NoError(t, err) {
			return
		}
		msg, err := bus.Encode(b.Subjects().Run(events.DefaultTenant, runID, "requested"), e, bus.ModeBinary)
		if assert.NoError(t, err) {
			assert.NoError(t, srv.Conn.PublishMsg(msg))
		}
	})
	require.Len(t, rows, 4)
	failed := map[string]bool{}
	for _, r := range rows {
		failed[r.Case] = r.Err != nil
	}
	assert.Equal(t, map[string]bool{
		"run.requested is a valid CloudEvent on its subject, its data fits its schema": false,
		"the subject, data.runId and the runid and tenant extensions agree":            false,
		"the run id is a ULID":       false,
		"the event id is the run id": true,
	}, failed)
}
