package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestGetFromLeaderReadsAsTheServerStoredIt reads a stream that allows
// direct gets and one that does not, by sequence, next by subject and
// last by subject: each answer is the stored message at the server's
// subject, sequence and time with the publisher's headers, whatever
// headers the publisher forged.
func TestGetFromLeaderReadsAsTheServerStoredIt(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, direct := range []bool{true, false} {
		name := map[bool]string{true: "LEADERGET_DIRECT", false: "LEADERGET"}[direct]
		_, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowDirect: direct})
		require.NoError(t, err)
		for i, subject := range []string{name + ".a", name + ".b", name + ".a"} {
			_, err := srv.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte{'0' + byte(i)},
				Header: nats.Header{"X": {"kept"}, "Nats-Sequence": {"99"}, "Nats-Subject": {name + ".forged"}}})
			require.NoError(t, err)
		}
		for _, c := range []struct {
			req          bus.LeaderGet
			seq          uint64
			subject, got string
		}{
			{bus.LeaderGet{Seq: 2}, 2, name + ".b", "1"},
			{bus.LeaderGet{Seq: 2, NextFor: name + ".a"}, 3, name + ".a", "2"},
			{bus.LeaderGet{LastFor: name + ".a"}, 3, name + ".a", "2"},
			{bus.LeaderGet{LastFor: name + ".b"}, 2, name + ".b", "1"},
		} {
			m, err := bus.GetFromLeader(ctx, srv.JS, name, c.req)
			require.NoError(t, err, "%s %+v", name, c.req)
			assert.Equal(t, c.seq, m.Sequence, "%s %+v", name, c.req)
			assert.Equal(t, c.subject, m.Subject, "%s %+v", name, c.req)
			assert.Equal(t, c.got, string(m.Data), "%s %+v", name, c.req)
			assert.Equal(t, "kept", m.Header.Get("X"))
			assert.WithinDuration(t, time.Now(), m.Time, time.Minute)
		}
		_, err = bus.GetFromLeader(ctx, srv.JS, name, bus.LeaderGet{Seq: 4, NextFor: name + ".a"})
		assert.ErrorIs(t, err, jetstream.ErrMsgNotFound)
		_, err = bus.GetFromLeader(ctx, srv.JS, name, bus.LeaderGet{LastFor: name + ".none"})
		assert.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	}
	_, err := bus.GetFromLeader(ctx, srv.JS, "NO_SUCH_STREAM", bus.LeaderGet{Seq: 1})
	var api *jetstream.APIError
	require.True(t, errors.As(err, &api), "%v", err)
	assert.Equal(t, jetstream.JSErrCodeStreamNotFound, api.ErrorCode)
}
