package process

// Attack review 37 (branch i37-attack), the publish answers of the shared
// requests stream: closed by the ingress (internal/ingress). The test
// asserts the secure behaviour: if it fails, the attack succeeds.

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// r37PubAck is a JetStream publish answer as the tenant receives it.
type r37PubAck struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// r37Publish publishes msg from a tenant's connection and returns the
// publish answer the service import brings back.
func r37Publish(t *testing.T, nc *nats.Conn, msg *nats.Msg) (r37PubAck, string) {
	t.Helper()
	reply, err := nc.RequestMsg(msg, 5*time.Second)
	require.NoError(t, err, "the tenant's publish is answered (the service import's reply)")
	var ack r37PubAck
	require.NoError(t, json.Unmarshal(reply.Data, &ack), "%s", reply.Data)
	return ack, string(reply.Data)
}

// r37Junk is a message on one of acme's own request subjects (a fresh run
// id: nothing of acme's is touched), carrying the headers h.
func r37Junk(h map[string]string) *nats.Msg {
	msg := nats.NewMsg("ab.run.acme." + events.NewID() + ".input")
	msg.Data = []byte(`{}`)
	for k, v := range h {
		msg.Header.Set(k, v)
	}
	return msg
}

// A tenant's publish reaches the requests stream only through the ingress
// (hosted by the deployed dispatcher binary, as the dispatcher user),
// which drops every Nats-* header and stores the request under a message
// id namespaced by the tenant. When tenants wrote the shared stream
// directly, JetStream's expectation headers were answered from the whole
// stream: "Nats-Expected-Last-Msg-Id" was refused with the stream's last
// message id — another tenant's run id — and
// "Nats-Expected-Last-Subject-Sequence-Subject" told, for any subject,
// whether another tenant stored a message there; a message id equal to
// another tenant's event id was answered "duplicate" and, published
// first, dropped the other tenant's request while its client was told it
// was stored. Now no answer names another tenant's id, the answers are the
// same whether another tenant's subject holds a message or not, and
// globex's request is stored whatever message ids acme used.
func TestReview37PublishAnswersLeakOtherTenantsRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server and the dispatcher")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := deployed(t, "acme", "globex")
	bin := buildServices(t)
	startService(t, filepath.Join(bin, "dispatcher"), srv.UserURL("dispatcher"))
	globex, err := client.New(srv.TenantConnect(t, "client-globex", "globex"), client.Options{Tenant: "globex"})
	require.NoError(t, err)
	acmeNC := srv.TenantConnect(t, "client-acme", "acme")

	// Globex starts a run (stored by the ingress; no planner is needed).
	secret, err := globex.Start(ctx, client.RunRequest{Prompt: "globex's quarterly numbers", UserID: "g1"})
	require.NoError(t, err)
	require.Equal(t, 1, srv.Stored(t, "AB_REQUESTS", "ab.run.globex."+secret+".requested"))

	t.Run("the last message id of the shared stream", func(t *testing.T) {
		ack, raw := r37Publish(t, acmeNC, r37Junk(map[string]string{"Nats-Expected-Last-Msg-Id": "x"}))
		assert.NotContains(t, raw, secret, "acme's publish answer names globex's run id")
		assert.Nil(t, ack.Error, "the expectation header never reaches the stream: %s", raw)
	})

	t.Run("whether another tenant's subject holds a message", func(t *testing.T) {
		probe := func(subject string) (r37PubAck, string) {
			return r37Publish(t, acmeNC, r37Junk(map[string]string{
				"Nats-Expected-Last-Subject-Sequence":         "0",
				"Nats-Expected-Last-Subject-Sequence-Subject": subject,
			}))
		}
		held, heldRaw := probe("ab.run.globex." + secret + ".requested")
		empty, emptyRaw := probe("ab.run.globex." + events.NewID() + ".requested")
		assert.Equal(t, empty.Error == nil, held.Error == nil,
			"acme tells a globex subject holding a message (%s) from an empty one (%s)", heldRaw, emptyRaw)
		wide, wideRaw := probe("ab.run.globex.>")
		assert.Nil(t, wide.Error, "acme reads the sequence of globex's last request: %s", wideRaw)
	})

	t.Run("another tenant's event id in the duplicate window", func(t *testing.T) {
		ack, _ := r37Publish(t, acmeNC, r37Junk(map[string]string{"Nats-Msg-Id": secret}))
		assert.False(t, ack.Duplicate, "acme learns that globex's run id was just used (duplicate of sequence %d)", ack.Seq)

		// Published first, acme's message id no longer drops globex's
		// request: run ids may be chosen by the caller
		// (RunRequest.RunID), and message ids are the tenant's own.
		chosen := events.NewID()
		r37Publish(t, acmeNC, r37Junk(map[string]string{"Nats-Msg-Id": chosen}))
		got, err := globex.Start(ctx, client.RunRequest{RunID: chosen, Prompt: "globex's order 42", UserID: "g1"})
		require.NoError(t, err, "globex's client is told the run was requested")
		assert.Equal(t, chosen, got)
		assert.Equal(t, 1, srv.Stored(t, "AB_REQUESTS", "ab.run.globex."+chosen+".requested"),
			"globex's run.requested was dropped as a duplicate of acme's message")
	})

	t.Run("a tenant's own republish still deduplicates", func(t *testing.T) {
		msg := r37Junk(map[string]string{"Nats-Msg-Id": "acme-once"})
		first, raw := r37Publish(t, acmeNC, msg)
		require.Nil(t, first.Error, "%s", raw)
		again, _ := r37Publish(t, acmeNC, msg)
		assert.True(t, again.Duplicate, "acme's republish with its own message id is a duplicate")
		assert.Equal(t, first.Seq, again.Seq)
		st, err := srv.JS.Stream(ctx, "AB_REQUESTS")
		require.NoError(t, err)
		stored, err := st.GetMsg(ctx, first.Seq)
		require.NoError(t, err)
		assert.Equal(t, msg.Subject, events.MustSubjects("ab").Canonical(stored.Subject), "stored under the run subject the readers filter on (and its partition)")
		assert.Equal(t, "acme.acme-once", stored.Header.Get(jetstream.MsgIDHeader), "the message id is namespaced by the subject's tenant")
		assert.Empty(t, stored.Header.Get("Nats-Expected-Last-Msg-Id"))
	})

	t.Run("nats.go's JetStream publish keeps working", func(t *testing.T) {
		js, err := jetstream.New(acmeNC)
		require.NoError(t, err)
		ack, err := js.Publish(ctx, "ab.run.acme."+events.NewID()+".input", []byte(`{}`))
		require.NoError(t, err, "js.Publish decodes the ingress's answer as a PubAck")
		assert.Equal(t, "AB_REQUESTS", ack.Stream)
		assert.NotZero(t, ack.Sequence)
	})
}
