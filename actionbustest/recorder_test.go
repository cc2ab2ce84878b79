package actionbustest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
)

func TestAwaitReturnsTheMessageOrAnErrorTheCallerWords(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "greet.>")
	require.NoError(t, srv.Conn.Publish("greet.ann", []byte("hi")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := rec.Await(ctx, func(r actionbustest.Recorded) bool { return r.Subject == "greet.ann" })
	require.NoError(t, err)
	assert.Equal(t, "hi", string(got.Data))

	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = rec.Await(short, func(r actionbustest.Recorded) bool { return r.Subject == "greet.bob" })
	assert.ErrorIs(t, err, actionbustest.ErrNotSeen)
	assert.True(t, errors.Is(err, context.DeadlineExceeded))
}

// TestUsersStartsTheServerWithTheDeployedUsers: with Options.Users the
// server enforces deploy/nats/accounts.conf: the client user may request
// runs but is refused a planner's decision subject; admin provisioned it.
func TestUsersStartsTheServerWithTheDeployedUsers(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	refused := make(chan error, 1)
	nc, err := nats.Connect(srv.UserURL("client"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case refused <- err:
		default:
		}
	}))
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Publish("ab.run.default.01JB0000000000000000000000.decision", []byte("{}")))
	require.NoError(t, nc.Flush())
	select {
	case err := <-refused:
		assert.Contains(t, err.Error(), "Permissions Violation")
	case <-time.After(5 * time.Second):
		t.Fatal("the client user was allowed to publish a decision")
	}
	_, err = nats.Connect(strings.Replace(srv.UserURL("client"), "pw-client", "wrong", 1))
	assert.Error(t, err, "a wrong password is refused")
	_, err = srv.JS.Stream(context.Background(), "AB_RUNS")
	assert.NoError(t, err, "provisioned as admin")
}
