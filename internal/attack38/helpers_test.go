// Package attack38_test holds the independent attacks on the audit,
// rejection and retry hardening of issue 38 (security rows 84-88): each
// test plays a deployed party (a tenant's NATS client, an executor) on a
// real embedded nats-server and asserts the safe behaviour, so that it
// fails while the hole it names is open.
package attack38_test

import (
	"context"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/internal/bus"
)

// publishRaw encodes e (binary mode) on subject, lets edit change the
// message (its headers) and publishes it through JetStream on nc, as the
// party nc is connected as.
func publishRaw(ctx context.Context, t *testing.T, nc *nats.Conn, subject string, e *event.Event, edit func(*nats.Msg)) *jetstream.PubAck {
	t.Helper()
	ack, err := tryPublishRaw(ctx, nc, subject, e, edit)
	require.NoError(t, err)
	return ack
}

// tryPublishRaw is publishRaw returning its error, for goroutines other
// than the test's (an action's handler).
func tryPublishRaw(ctx context.Context, nc *nats.Conn, subject string, e *event.Event, edit func(*nats.Msg)) (*jetstream.PubAck, error) {
	msg, err := bus.Encode(subject, e, bus.ModeBinary)
	if err != nil {
		return nil, err
	}
	if edit != nil {
		edit(msg)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return js.PublishMsg(ctx, msg)
}

// operatorServer starts a server in operator mode: every service of a
// stack connects as its own deployed user, and the attacker connects as
// one (ServiceConnect, TenantAdd).
func operatorServer(t *testing.T, maxPayload int32) *actionbustest.Server {
	t.Helper()
	return actionbustest.NewServer(t, actionbustest.Options{Operator: true, MaxPayload: maxPayload})
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
