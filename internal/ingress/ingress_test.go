package ingress_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/ingress"
)

var subjects = events.MustSubjects("ab")

func TestCarried(t *testing.T) {
	for name, want := range map[string]bool{
		"ce-id": true, "Ce-Type": true, "ce-tenant": true, "ce-traceparent": true, "Content-Type": true,
		"traceparent": true, "tracestate": true,
		"Nats-Msg-Id": false, "Nats-Expected-Last-Msg-Id": false, "Nats-Expected-Last-Subject-Sequence": false,
		"Nats-Expected-Last-Subject-Sequence-Subject": false, "Nats-Rollup": false, "Nats-TTL": false,
		"Nats-Schedule": false, "Nats-Expected-Stream": false, "X-Other": false, "": false,
	} {
		assert.Equal(t, want, ingress.Carried(name), name)
	}
}

func TestMsgID(t *testing.T) {
	h := func(kv ...string) nats.Header {
		out := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	for _, c := range []struct {
		name, tenant string
		h            nats.Header
		want         string
	}{
		{"the client's message id", "acme", h("Nats-Msg-Id", "E1", "ce-id", "E2"), "acme.E1"},
		{"the event id without one", "acme", h("ce-id", "E2"), "acme.E2"},
		{"neither", "acme", h(), ""},
		{"too long", "acme", h("Nats-Msg-Id", strings.Repeat("x", 129)), ""},
		{"another tenant's id stays acme's", "acme", h("Nats-Msg-Id", "globex.E1"), "acme.globex.E1"},
	} {
		assert.Equal(t, c.want, ingress.MsgID(c.tenant, c.h), c.name)
	}
}

func TestIngest(t *testing.T) {
	run := events.NewID()
	m := nats.NewMsg("ab.run.acme." + run + ".cancel")
	m.Data = []byte(`{"x":1}`)
	m.Header.Set("ce-id", "E1")
	m.Header.Set("Content-Type", "application/cloudevents+json")
	m.Header.Set("traceparent", "00-x")
	m.Header.Set("Nats-Msg-Id", "M1")
	m.Header.Set("Nats-Expected-Last-Msg-Id", "x")
	m.Header.Set("Nats-Rollup", "all")
	out, err := ingress.Ingest(subjects, m)
	require.NoError(t, err)
	assert.Equal(t, "ab.ingress.acme."+run+".cancel", out.Subject)
	assert.Equal(t, m.Data, out.Data)
	assert.Equal(t, nats.Header{"Ce-Id": {"E1"}, "Content-Type": {"application/cloudevents+json"}, "Traceparent": {"00-x"},
		"Nats-Msg-Id": {"acme.M1"}}, canon(out.Header))

	for subject, code := range map[string]actionbus.Code{
		"ab.run.acme." + run + ".completed":  actionbus.CodeSubjectMismatch,
		"ab.run.acme." + run + ".sched.x":    actionbus.CodeSubjectMismatch,
		"ab.ingress.acme." + run + ".cancel": actionbus.CodeSubjectMismatch,
		"ab.run.admin." + run + ".requested": actionbus.CodeInvalidTenant,
		"ab.run.ACME." + run + ".requested":  actionbus.CodeInvalidTenant,
		"other.run.acme." + run + ".cancel":  actionbus.CodeSubjectMismatch,
		"ab.run.acme.cancel":                 actionbus.CodeSubjectMismatch,
	} {
		_, err := ingress.Ingest(subjects, &nats.Msg{Subject: subject})
		assert.Equal(t, code, actionbus.CodeOf(err), subject)
	}
}

func canon(h nats.Header) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		out[textproto.CanonicalMIMEHeaderKey(k)] = v
	}
	return out
}

func TestErrorAnswerDecodesAsAJetStreamError(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
	}{
		{actionbus.Errorf(actionbus.CodeInvalidTenant, "bad"), 400},
		{errors.New("timeout"), 503},
		{&jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum messages exceeded"}, 503},
	} {
		var out struct {
			Error jetstream.APIError `json:"error"`
		}
		require.NoError(t, json.Unmarshal(ingress.ErrorAnswer(c.err), &out))
		assert.Equal(t, c.code, out.Error.Code, "%v", c.err)
		assert.NotEmpty(t, out.Error.Description)
	}
}

// FuzzIngest feeds the ingress outside input (any subject, headers and
// body): it never panics, and whatever it stores is on an ingested
// subject, with no Nats-* header but its own message id.
func FuzzIngest(f *testing.F) {
	f.Add("ab.run.acme.01J0000000000000000000000A.requested", "Nats-Rollup", "all", []byte(`{}`))
	f.Add("ab.run.acme.x.input", "Nats-Msg-Id", "globex.1", []byte(`x`))
	f.Add("ab.run..x.deny", "ce-id", "", []byte(nil))
	f.Fuzz(func(t *testing.T, subject, hk, hv string, body []byte) {
		m := &nats.Msg{Subject: subject, Header: nats.Header{hk: {hv}}, Data: body}
		out, err := ingress.Ingest(subjects, m)
		if err != nil {
			return
		}
		require.True(t, strings.HasPrefix(out.Subject, "ab.ingress."), out.Subject)
		tenant, _, _, ok := subjects.RequestFromSubject(subject)
		require.True(t, ok)
		for k := range out.Header {
			if strings.HasPrefix(strings.ToLower(k), "nats-") {
				require.Equal(t, jetstream.MsgIDHeader, k)
				require.True(t, strings.HasPrefix(out.Header.Get(k), tenant+"."))
			}
		}
	})
}

// A request reaches the stream only through the ingress, which answers a
// raw nats.Request with the stream's PubAck and nats.go's js.Publish
// unchanged; the stream stores it under its run subject.
func TestServiceStoresAndAnswersWithThePubAck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	nc := srv.Connect(t)
	run := events.NewID()
	subject := "ab.run.acme." + run + ".input"

	// Without the ingress nothing stores a request.
	_, err := nc.Request(subject, []byte(`{}`), 200*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrNoResponders)

	in, err := ingress.New(srv.Connect(t), ingress.Config{})
	require.NoError(t, err)
	require.NoError(t, in.Start())
	t.Cleanup(in.Stop)

	msg := nats.NewMsg(subject)
	msg.Header.Set("Nats-Msg-Id", "once")
	msg.Data = []byte(`{}`)
	reply, err := nc.RequestMsg(msg, 5*time.Second)
	require.NoError(t, err)
	var ack jetstream.PubAck
	require.NoError(t, json.Unmarshal(reply.Data, &ack), "%s", reply.Data)
	assert.Equal(t, "AB_REQUESTS", ack.Stream)

	js, err := jetstream.New(nc)
	require.NoError(t, err)
	again, err := js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	assert.True(t, again.Duplicate)
	assert.Equal(t, ack.Sequence, again.Sequence)
	assert.Equal(t, 1, srv.Stored(t, "AB_REQUESTS", subject))

	_, err = js.Publish(ctx, "ab.run.admin."+run+".input", []byte(`{}`))
	var api *jetstream.APIError
	require.ErrorAs(t, err, &api, "a refusal is a JetStream error")
	assert.Contains(t, api.Description, string(actionbus.CodeInvalidTenant))
}

// The ingress answers only inboxes and service imports' response
// subjects: a reply subject aimed at a store gets nothing.
func TestServiceAnswersNoArbitraryReplySubject(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	nc := srv.Connect(t)
	in, err := ingress.New(srv.Connect(t), ingress.Config{})
	require.NoError(t, err)
	require.NoError(t, in.Start())
	t.Cleanup(in.Stop)

	aimed, err := nc.SubscribeSync("ab.aimed.>")
	require.NoError(t, err)
	run := events.NewID()
	require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: "ab.run.acme." + run + ".input", Reply: "ab.aimed.x", Data: []byte(`{}`)}))
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool { return srv.Stored(t, "AB_REQUESTS", "ab.run.acme."+run+".input") == 1 },
		10*time.Second, 20*time.Millisecond, "the request is stored")
	in.Stop() // every answer in hand is sent
	require.NoError(t, nc.Flush())
	_, err = aimed.NextMsg(100 * time.Millisecond)
	assert.ErrorIs(t, err, nats.ErrTimeout, "the ingress answered an arbitrary reply subject")
}

// TestOnlyARunsFirstStoredMessageIsMarkedFirst: the ingress marks a run's
// request stored as the run's first message in the requests stream
// (FirstOfRunHeader), and nothing else: a second request of the run under
// another id, a request after the run's cancel, and a cancel are stored
// unmarked; a republished first request is deduplicated with the first's
// acknowledgement; and a publisher's own mark never crosses.
func TestOnlyARunsFirstStoredMessageIsMarkedFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	nc := srv.Connect(t)
	requests, err := srv.JS.Stream(ctx, "AB_REQUESTS")
	require.NoError(t, err)
	require.True(t, ingress.MarksFirstOfRun(requests.CachedInfo().Config), "a stream of one replica")
	in, err := ingress.New(srv.Connect(t), ingress.Config{MarkFirstOfRun: true})
	require.NoError(t, err)
	require.NoError(t, in.Start())
	t.Cleanup(in.Stop)
	send := func(subject, id string, header ...string) jetstream.PubAck {
		t.Helper()
		msg := nats.NewMsg(subject)
		msg.Header.Set("Nats-Msg-Id", id)
		for i := 0; i+1 < len(header); i += 2 {
			msg.Header.Set(header[i], header[i+1])
		}
		msg.Data = []byte(`{}`)
		reply, err := nc.RequestMsg(msg, 5*time.Second)
		require.NoError(t, err)
		var ack jetstream.PubAck
		require.NoError(t, json.Unmarshal(reply.Data, &ack), "%s", reply.Data)
		require.Equal(t, "AB_REQUESTS", ack.Stream, "%s", reply.Data)
		return ack
	}
	marked := func(ack jetstream.PubAck) bool {
		t.Helper()
		m, err := requests.GetMsg(ctx, ack.Sequence)
		require.NoError(t, err)
		return m.Header.Get(ingress.FirstOfRunHeader) == "1"
	}

	run := events.NewID()
	first := send(subjects.Run("acme", run, "requested"), "first")
	assert.True(t, marked(first), "the run's first request is marked")
	again := send(subjects.Run("acme", run, "requested"), "first")
	assert.True(t, again.Duplicate, "a republished request is deduplicated")
	assert.Equal(t, first.Sequence, again.Sequence)
	second := send(subjects.Run("acme", run, "requested"), "second", ingress.FirstOfRunHeader, "1")
	assert.NotEqual(t, first.Sequence, second.Sequence)
	assert.False(t, marked(second), "a second request of the run is not marked, whatever its publisher says")
	assert.False(t, marked(send(subjects.Run("acme", run, "cancel"), "cancel")), "a cancel is not marked")

	// Another tenant's run of the same id is a run of its own.
	assert.True(t, marked(send(subjects.Run("globex", run, "requested"), "first")), "another tenant's run is its own")

	canceled := events.NewID()
	assert.False(t, marked(send(subjects.Run("acme", canceled, "cancel"), "c", ingress.FirstOfRunHeader, "1")))
	assert.False(t, marked(send(subjects.Run("acme", canceled, "requested"), "r")),
		"a request stored after its run's cancel is not its run's first message")

	// An ingress told not to mark (a replicated stream) marks nothing.
	in.Stop()
	unmarking, err := ingress.New(srv.Connect(t), ingress.Config{})
	require.NoError(t, err)
	require.NoError(t, unmarking.Start())
	t.Cleanup(unmarking.Stop)
	assert.False(t, marked(send(subjects.Run("acme", events.NewID(), "requested"), "plain")), "marked without MarkFirstOfRun")
}

// TestOnlyAStreamOfOneReplicaHasItsRunsFirstRequestsMarked: a replicated
// stream's leader does not see, under the expectation's filter, a message
// of the run proposed and not yet applied, so its mark could lie.
func TestOnlyAStreamOfOneReplicaHasItsRunsFirstRequestsMarked(t *testing.T) {
	for replicas, want := range map[int]bool{0: true, 1: true, 3: false, 5: false} {
		assert.Equal(t, want, ingress.MarksFirstOfRun(jetstream.StreamConfig{Replicas: replicas}), replicas)
	}
}
