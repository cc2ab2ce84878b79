package attack38_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestAttack38_ExecutorHoldsAMessageUnrejectableWithEscapedHeaders: row
// 85 says a message at the server's max payload is still rejectable, its
// rejection keeping header values up to 1 KiB, 64 of them. The bounds
// are fixed bytes of the original, not of the rejection: each kept byte
// of '<' is six once the rejection's JSON escapes it (\u003c). On a
// server whose max payload is 256 KiB, the deployed executor user
// publishes on a run's result subject a 62 KB message (no CloudEvent)
// with 60 header values of 1 KiB of '<' (JetStream takes 64 KiB of
// headers): its rejection is about 370 KB,
// cannot be published, and the message is delivered again for ever to
// every consumer of the runs stream; the auditor, which acknowledges by
// position, then acknowledges no later event either. Safe: a rejection is
// stored, every consumer's acknowledgement passes the message, and the
// auditor acknowledges the run after it.
func TestAttack38_ExecutorHoldsAMessageUnrejectableWithEscapedHeaders(t *testing.T) {
	srv := operatorServer(t, 256<<10)
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "page.render", Description: "Render a page."},
			func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
				return executor.Result[string]{Output: "<p>"}, nil
			})
	}})
	exec := srv.ServiceConnect(t, "executor")
	ctx := ctxFor(t, 60*time.Second)

	subject := events.MustSubjects(srv.Prefix).Run(events.DefaultTenant, events.NewID(), "result")
	msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte("x")}
	for i := range 60 { // JetStream stores at most 64 KiB of headers
		msg.Header[fmt.Sprintf("X-Pad-%02d", i)] = []string{strings.Repeat("<", bus.MaxRejectedHeader)}
	}
	js, err := jetstream.New(exec)
	require.NoError(t, err)
	ack, err := js.PublishMsg(ctx, msg)
	require.NoError(t, err, "the message fits the server's max payload")

	ok := assert.Eventually(t, func() bool { return srv.Stored(t, "AB_REJECTED", ">") > 0 }, 15*time.Second, 100*time.Millisecond,
		"the message is rejected: its rejection is stored")
	stream, err := srv.JS.Stream(ctx, "AB_RUNS")
	require.NoError(t, err)
	held := func() []string {
		var out []string
		for info := range stream.ListConsumers(ctx).Info() {
			if info.Name != "dispatcher" && info.Name != "auditor-runs" {
				continue // the planner's consumer filters other subjects
			}
			if info.AckFloor.Stream < ack.Sequence {
				out = append(out, fmt.Sprintf("%s (ack floor %d, pending %d, redelivered %d)", info.Name, info.AckFloor.Stream,
					info.NumAckPending, info.NumRedelivered))
			}
		}
		return out
	}
	ok = assert.Eventually(t, func() bool { return len(held()) == 0 }, 15*time.Second, 100*time.Millisecond,
		"every consumer of the runs stream acknowledges past the message") && ok
	if !ok {
		t.Logf("consumers held at the message: %v", held())
	}

	// The auditor acknowledges by position: held at the message, it
	// acknowledges none of the runs after it either.
	res, err := st.Client.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "page.render", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	last, err := stream.Info(ctx)
	require.NoError(t, err)
	assert.Eventually(t, func() bool {
		info, err := stream.Consumer(ctx, "auditor-runs")
		return err == nil && info.CachedInfo().AckFloor.Stream >= last.State.LastSeq
	}, 15*time.Second, 100*time.Millisecond, "the auditor acknowledges the run after the message (up to stream sequence %d)", last.State.LastSeq)
}

// TestAttack38_TenantClientHoldsTheAuditorWithAnUnrejectableRequest: the
// same from the least trusted party. On a server whose max payload is
// 256 KiB, a tenant's NATS client publishes a run request whose data
// fails its schema, with 60 ce- headers of 1 KiB of '<' (the ingress
// carries every ce- header into the stored request). The dispatcher and
// the auditor reject it; neither rejection fits, so the request is
// delivered again for ever, and the auditor, which acknowledges the
// requests stream by position, acknowledges no later request. Safe: the
// request's run ends (failed), its rejection is stored, and the auditor
// acknowledges the requests after it.
func TestAttack38_TenantClientHoldsTheAuditorWithAnUnrejectableRequest(t *testing.T) {
	srv := operatorServer(t, 256<<10)
	const tenant = "acme"
	nc := srv.TenantAdd(t, tenant, actionbustest.TenantLimits{})
	runs := srv.Record(t, srv.Prefix+".run.>")
	srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "page.render", Description: "Render a page."},
			func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
				return executor.Result[string]{Output: "<p>"}, nil
			})
	}})
	ctx := ctxFor(t, 90*time.Second)
	eb, err := bus.Open(nc, bus.BusConfig{Source: "/client"})
	require.NoError(t, err)
	runID := events.NewID()
	e, err := eb.New(events.TypeRunRequested, runID, tenant, runID, &events.RunRequested{RunID: runID, UserID: "ada",
		Action: &events.ActionCall{Name: "page.render", Args: map[string]any{}}})
	require.NoError(t, err)
	ack := publishRaw(ctx, t, nc, events.MustSubjects(srv.Prefix).Run(tenant, runID, "requested"), e, func(m *nats.Msg) {
		m.Data = []byte(`{}`) // fails the schema of run.requested
		for i := range 60 {
			m.Header[fmt.Sprintf("ce-pad%02d", i)] = []string{strings.Repeat("<", bus.MaxRejectedHeader)}
		}
	})

	runs.WaitForType(t, 15*time.Second, events.TypeRunFailed, runID)
	ok := assert.Eventually(t, func() bool { return srv.Stored(t, "AB_REJECTED", ">") > 0 }, 15*time.Second, 100*time.Millisecond,
		"the request is rejected: its rejection is stored")
	stream, err := srv.JS.Stream(ctx, "AB_REQUESTS")
	require.NoError(t, err)
	floor := func(name string) uint64 {
		c, err := stream.Consumer(ctx, name)
		if err != nil {
			return 0
		}
		return c.CachedInfo().AckFloor.Stream
	}
	ok = assert.Eventually(t, func() bool {
		return floor("auditor-requests") >= ack.Sequence && floor(bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0)) >= ack.Sequence
	},
		15*time.Second, 100*time.Millisecond, "the dispatcher and the auditor acknowledge the request") && ok
	if !ok {
		t.Logf("ack floors at the request (stream sequence %d): auditor %d, dispatcher %d", ack.Sequence, floor("auditor-requests"), floor(bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0)))
	}

	c, err := client.New(nc, client.Options{Prefix: srv.Prefix, Tenant: tenant})
	require.NoError(t, err)
	res, err := c.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "page.render", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	last, err := stream.Info(ctx)
	require.NoError(t, err)
	assert.Eventually(t, func() bool { return floor("auditor-requests") >= last.State.LastSeq }, 15*time.Second, 100*time.Millisecond,
		"the auditor acknowledges the request after it (stream sequence %d)", last.State.LastSeq)
}
