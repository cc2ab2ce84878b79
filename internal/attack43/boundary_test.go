package attack43_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// jsAnswered reports whether a JetStream API request on subject got an
// answer that is not an error (the request reached JetStream and was
// served), and the answer.
func jsAnswered(nc *nats.Conn, subject string, body []byte) (bool, string) {
	m, err := nc.Request(subject, body, 400*time.Millisecond)
	if err != nil {
		return false, err.Error()
	}
	var resp struct {
		Error *json.RawMessage `json:"error"`
	}
	if json.Unmarshal(m.Data, &resp) == nil && resp.Error != nil {
		return false, string(m.Data)
	}
	return len(m.Data) > 0, string(m.Data)
}

// TestASiteReachesNoJetStreamAPIBeyondItsPool sends, from a client of the
// site's leaf node (the shipped leaf.conf, linked as the default pool's
// executor user), JetStream API requests on what the pool's executor may
// not touch, in the plain form and in the form of the cluster's JetStream
// domain ($JS.actionbus.API., mapped by the hub to $JS.API.) and of another
// domain: another pool's buckets, consumer and artifacts, the run states,
// the catalog, the policy, the audit stream, the account's stream list and
// info, creating, deleting and purging. None may be served. The control
// requests (the pool's own, in the domain's form) must be, or the probe
// proves nothing. It passes when the boundary holds.
func TestASiteReachesNoJetStreamAPIBeyondItsPool(t *testing.T) {
	h := hub(t)
	_, nc := site(t, h, "executor")
	for _, ok := range []string{
		"$JS.actionbus.API.STREAM.INFO.AB_WORK",
		"$JS.actionbus.API.CONSUMER.INFO.AB_WORK.pool-default",
		"$JS.actionbus.API.STREAM.INFO.KV_ab_idempotency_default",
	} {
		served, answer := jsAnswered(nc, ok, nil)
		require.True(t, served, "control %s: %s", ok, answer)
	}
	var probes []string
	for _, api := range []string{
		"STREAM.INFO.KV_ab_idempotency_other",
		"STREAM.MSG.GET.KV_ab_idempotency_other",
		"DIRECT.GET.KV_ab_idempotency_other.$KV.ab_idempotency_other.k",
		"STREAM.INFO.KV_ab_presence_other",
		"STREAM.INFO.OBJ_ab_artifacts_other",
		"DIRECT.GET.OBJ_ab_artifacts_other.$O.ab_artifacts_other.M.x",
		"CONSUMER.INFO.AB_WORK.pool-other",
		"CONSUMER.MSG.NEXT.AB_WORK.pool-other",
		"STREAM.INFO.KV_ab_runs",
		"STREAM.MSG.GET.KV_ab_runs",
		"DIRECT.GET.KV_ab_runs.$KV.ab_runs.acme.x",
		"STREAM.INFO.KV_ab_catalog",
		"DIRECT.GET.KV_ab_catalog.$KV.ab_catalog.x",
		"STREAM.INFO.KV_ab_policy",
		"STREAM.INFO.AB_AUDIT",
		"DIRECT.GET.AB_AUDIT",
		"DIRECT.GET.AB_RUNS",
		"STREAM.MSG.GET.AB_RUNS",
		"STREAM.NAMES",
		"STREAM.LIST",
		"INFO",
		"ACCOUNT.INFO",
		"STREAM.PURGE.AB_WORK",
		"STREAM.DELETE.AB_REJECTED",
		"CONSUMER.DELETE.AB_WORK.pool-default",
		"CONSUMER.CREATE.AB_RUNS.spy",
		"CONSUMER.CREATE.AB_WORK.spy.ab.pool.other.request",
		"CONSUMER.DURABLE.CREATE.AB_WORK.spy",
		"STREAM.CREATE.SPY",
	} {
		probes = append(probes, "$JS.API."+api, "$JS.actionbus.API."+api, "$JS.hub.API."+api)
	}
	// One body for all: what a get, a fetch or a create would carry.
	body := []byte(`{"last_by_subj":"$KV.ab_runs.acme.x","seq":1,"batch":1,"name":"SPY","subjects":["spy"],"config":{"durable_name":"spy","filter_subject":"ab.pool.other.request"}}`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	served := map[string]string{}
	for _, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, answer := jsAnswered(nc, p, body); ok {
				mu.Lock()
				served[p] = answer
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for p, answer := range served {
		assert.Fail(t, "served through the site", "%s answered %s", p, answer)
	}
	require.NoError(t, nc.Flush())
	// Nothing was created, deleted or purged behind the probes' backs.
	names := []string{}
	for n := range h.JS.StreamNames(ctxFor(t, 10*time.Second)).Name() {
		names = append(names, n)
	}
	assert.NotContains(t, names, "SPY")
	assert.Contains(t, names, "AB_REJECTED")
	_, err := h.JS.Consumer(ctxFor(t, 10*time.Second), "AB_WORK", "pool-default")
	assert.NoError(t, err, "the pool's consumer is still there")
	_, err = h.JS.Consumer(ctxFor(t, 10*time.Second), "AB_RUNS", "spy")
	assert.Error(t, err, "no consumer was created on AB_RUNS")
}

// TestASitePublishesNothingBeyondItsPool publishes, from a client of the
// site, on subjects the default pool's executor user may not: another
// tenant's run events (a terminal one, a request), another pool's work and
// announcement, the ingress, the audit trail, the run-state, catalog,
// policy and other pool's buckets and artifacts in their plain and domain
// forms. Nothing may be stored. It passes when the boundary holds.
func TestASitePublishesNothingBeyondItsPool(t *testing.T) {
	h := hub(t)
	_, nc := site(t, h, "executor")
	targets := []struct{ stream, subject string }{
		{"AB_RUNS", "ab.run.acme.01JATTACKRUN0000000000000.completed"},
		{"AB_RUNS", "ab.run.acme.01JATTACKRUN0000000000000.started"},
		{"AB_RUNS", "ab.run.acme.01JATTACKRUN0000000000000.failed"},
		{"AB_REQUESTS", "ab.ingress.acme.01JATTACKRUN0000000000000.requested"},
		{"AB_WORK", "ab.pool.other.request"},
		{"AB_WORK", "ab.pool.default.request"},
		{"AB_AUDIT", "ab.audit.acme.01JATTACKRUN0000000000000.rec"},
		{"AB_TIMERS", "ab.run.acme.01JATTACKRUN0000000000000.timer"},
		{"KV_ab_runs", "$KV.ab_runs.acme.x"},
		{"KV_ab_catalog", "$KV.ab_catalog.x"},
		{"KV_ab_policy", "$KV.ab_policy.x"},
		{"KV_ab_idempotency_other", "$KV.ab_idempotency_other.k"},
		{"KV_ab_presence_other", "$KV.ab_presence_other.k"},
		{"OBJ_ab_artifacts_other", "$O.ab_artifacts_other.M.x"},
		{"OBJ_ab_artifacts", "$O.ab_artifacts.M.x"},
	}
	had := map[string]uint64{}
	for _, tg := range targets {
		had[tg.subject] = lastSeq(t, h.JS, tg.stream, tg.subject)
	}
	for _, tg := range targets {
		for _, subject := range []string{tg.subject, "$JS.actionbus.API." + tg.subject} {
			require.NoError(t, nc.Publish(subject, []byte(`{}`)))
		}
	}
	// The control, published last on the same link: once it is stored,
	// everything before it has arrived at the hub.
	before := lastSeq(t, h.JS, "AB_REJECTED", "ab.rejected.attack43")
	_, err := nc.Request("ab.rejected.attack43", []byte(`{}`), 5*time.Second)
	require.NoError(t, err)
	require.Greater(t, lastSeq(t, h.JS, "AB_REJECTED", "ab.rejected.attack43"), before)
	for _, tg := range targets {
		assert.Equal(t, had[tg.subject], lastSeq(t, h.JS, tg.stream, tg.subject), "the site stored a message on %s", tg.subject)
	}
}

// TestASiteReceivesNothingBeyondItsPool subscribes, from a client of the
// site, to everything (">") and to subjects the default pool's executor
// user may not read: another pool's work, the tenants' requests to the
// read service, results, audit records, the services' inboxes (the
// executor's own inbox prefix too: the site's inbox is its pool
// account's, not a subject of ACTIONBUS), bucket updates. The hub then
// publishes on each; the site may receive only what its pool's account
// imports (its pool's ended signal; since A43-3 no run's terminal
// events). It passes when the boundary holds.
func TestASiteReceivesNothingBeyondItsPool(t *testing.T) {
	h := hub(t)
	_, nc := site(t, h, "executor")
	forbidden := []string{
		"ab.pool.other.request", "ab.pool.default.request", "ab.api.acme.runs", "ab.run.acme.R.result",
		"ab.run.acme.R.requested", "ab.run.acme.R.approval", "ab.run.acme.R.started", "ab.audit.acme.R.rec",
		"ab.stream.acme.R", "_INBOX_dispatcher.x", "_INBOX_executor-other.x", "_INBOX_acme.x", "$KV.ab_runs.acme.x",
		"ab.pool.other.announce", "ab.pool.other.ended", "ab.run.acme.R.completed", "ab.run.acme.R.failed",
		"_INBOX_executor.x",
	}
	got := make(chan string, 1024)
	for _, s := range append([]string{">", "ab.>", "ab.run.*.*.*", "ab.run.acme.>", "_INBOX_executor.>"}, forbidden...) {
		_, err := nc.Subscribe(s, func(m *nats.Msg) { got <- fmt.Sprintf("%s %s (by %s)", m.Subject, m.Data, s) })
		require.NoError(t, err)
	}
	require.NoError(t, nc.Flush())
	// Interest crosses the link asynchronously: the allowed subject is
	// received once the site's subscriptions are known to the hub.
	admin := h.Conn
	require.Eventually(t, func() bool {
		require.NoError(t, admin.Publish("ab.pool.default.ended", []byte("probe")))
		require.NoError(t, admin.Flush())
		select {
		case <-got:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	}, 10*time.Second, 10*time.Millisecond, "the site receives its pool's ended signal")
	for _, s := range forbidden {
		require.NoError(t, admin.Publish(s, []byte(`{}`)))
	}
	// Published after the forbidden ones on the same connection: once it
	// arrives, they would have too.
	require.NoError(t, admin.Publish("ab.pool.default.ended", []byte("last")))
	require.NoError(t, admin.Flush())
	var received []string
	deadline := time.After(5 * time.Second)
	for done := false; !done; {
		select {
		case s := <-got:
			received = append(received, s)
			if strings.HasPrefix(s, "ab.pool.default.ended last") {
				done = true
			}
		case <-deadline:
			done = true
		}
	}
	for _, s := range received {
		if !strings.HasPrefix(s, "ab.pool.default.ended ") {
			assert.Fail(t, "received through the site", s)
		}
	}
	assert.Contains(t, fmt.Sprint(received), "ab.pool.default.ended last", "the control arrived")
}
