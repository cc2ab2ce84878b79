package bus_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/internal/bus"
)

// answer is a direct get's answer as jetstreamext hands it on: Subject,
// Sequence and Time from the first value of each header, which is the
// publisher's own when it stored one.
func answer(h nats.Header) *jetstream.RawStreamMsg {
	m := &jetstream.RawStreamMsg{Header: h, Data: []byte("x")}
	m.Subject = h.Get(jetstream.SubjectHeader)
	m.Time, _ = time.Parse(time.RFC3339Nano, h.Get(jetstream.TimeStampHeaer))
	return m
}

func TestReadAsStoredTakesTheServersHeaders(t *testing.T) {
	const at = "2026-12-07T16:00:00.5Z"
	server := func(extra nats.Header) nats.Header {
		h := nats.Header{}
		for k, v := range extra { // stored first
			h[k] = append(h[k], v...)
		}
		h.Add(jetstream.StreamHeader, "AB_RUNS")
		h.Add(jetstream.SubjectHeader, "ab.run.default.R.result.0")
		h.Add(jetstream.SequenceHeader, "42")
		h.Add(jetstream.TimeStampHeaer, at)
		return h
	}
	want, _ := time.Parse(time.RFC3339Nano, at)
	for name, stored := range map[string]nats.Header{
		"a genuine message":       {"ce-type": {"x"}},
		"a forged subject":        {jetstream.SubjectHeader: {"ab.run.default.R.completed.0"}},
		"a forged sequence":       {jetstream.SequenceHeader: {"1"}},
		"a forged time":           {jetstream.TimeStampHeaer: {"2000-01-01T00:00:00Z"}},
		"every read header":       {jetstream.SubjectHeader: {"a"}, jetstream.SequenceHeader: {"7"}, jetstream.TimeStampHeaer: {"2000-01-01T00:00:00Z"}},
		"a forged header twice":   {jetstream.SequenceHeader: {"1", "2"}},
		"no header stored at all": nil,
	} {
		t.Run(name, func(t *testing.T) {
			got, err := bus.ReadAsStored(answer(server(stored)))
			require.NoError(t, err)
			assert.Equal(t, "ab.run.default.R.result.0", got.Subject)
			assert.Equal(t, uint64(42), got.Sequence)
			assert.True(t, want.Equal(got.Time), "%v", got.Time)
			assert.Equal(t, []byte("x"), got.Data)
		})
	}
	for name, h := range map[string]nats.Header{
		"no subject":     {jetstream.SequenceHeader: {"1"}, jetstream.TimeStampHeaer: {at}},
		"no sequence":    {jetstream.SubjectHeader: {"s"}, jetstream.TimeStampHeaer: {at}},
		"a bad sequence": {jetstream.SubjectHeader: {"s"}, jetstream.SequenceHeader: {"x"}, jetstream.TimeStampHeaer: {at}},
		"no time":        {jetstream.SubjectHeader: {"s"}, jetstream.SequenceHeader: {"1"}},
	} {
		_, err := bus.ReadAsStored(answer(h))
		assert.Error(t, err, name)
	}
}

func FuzzReadAsStored(f *testing.F) {
	f.Add("ab.run.t.r.result.0", "42", "2026-12-07T16:00:00Z", "1")
	f.Fuzz(func(t *testing.T, subject, seq, stamp, forged string) {
		h := nats.Header{jetstream.SequenceHeader: {forged, seq}, jetstream.SubjectHeader: {subject}, jetstream.TimeStampHeaer: {stamp}}
		got, err := bus.ReadAsStored(answer(h))
		if err == nil && (got.Subject != subject || seq == "") {
			t.Fatalf("read %q at %d from %q/%q", got.Subject, got.Sequence, subject, seq)
		}
	})
}

// TestAsStoredReadsABatchAtTheServersValues: a batch direct get of a real
// stream read through AsStored yields each message at the subject and
// sequence the server stored it under, whatever headers it was stored
// with, and ends without an error where the stream's messages end.
func TestAsStoredReadsABatchAtTheServersValues(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{SkipProvision: true})
	ctx := ctxT(t)
	_, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "DG", Subjects: []string{"dg.>"}, AllowDirect: true})
	require.NoError(t, err)
	for i, h := range []nats.Header{nil, {jetstream.SequenceHeader: {"1"}}, {jetstream.SubjectHeader: {"dg.forged"}}} {
		_, err := srv.JS.PublishMsg(ctx, &nats.Msg{Subject: fmt.Sprintf("dg.m%d", i), Data: []byte("x"), Header: h})
		require.NoError(t, err)
	}
	read := func(from uint64) (subjects []string, seqs []uint64) {
		it, err := jetstreamext.GetBatch(ctx, srv.JS, "DG", 10, jetstreamext.GetBatchSeq(from))
		require.NoError(t, err)
		for m, err := range bus.AsStored(it) {
			require.NoError(t, err)
			subjects, seqs = append(subjects, m.Subject), append(seqs, m.Sequence)
		}
		return subjects, seqs
	}
	subjects, seqs := read(1)
	assert.Equal(t, []string{"dg.m0", "dg.m1", "dg.m2"}, subjects)
	assert.Equal(t, []uint64{1, 2, 3}, seqs)
	subjects, _ = read(4)
	assert.Empty(t, subjects, "past the end: no message, no error")
}
