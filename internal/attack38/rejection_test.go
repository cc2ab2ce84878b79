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
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/events"
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
		msg.Header[fmt.Sprintf("X-Pad-%02d", i)] = []string{strings.Repeat("<", events.MaxRejectedHeader)}
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
