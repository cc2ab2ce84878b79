package actionbustest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
)

func TestAwaitReturnsTheMessageOrAnErrorTheCallerWords(t *testing.T) {
	srv := actionbustest.NewServer(t)
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
