package attack43_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTwoSitesOfAPoolSeeNoneOfEachOthersReplies links two sites (two
// customers' networks, say) to the hub as the default pool's executor
// user, as docs/operations.md tells every site of a pool to. Site B
// subscribes to the pool's reply prefix (_INBOX_executor.>, which the
// executor user may, and every site's executor uses); site A's executor
// then asks JetStream something. B must not receive A's answer: answers
// to A's pulls are A's work (the calls' inputs), answers to its
// idempotency reads A's results.
//
// It FAILS while the hole is open: the link is one user for every site
// of the pool, whose reply prefix is one subject space, so the hub sends
// every site every other site's replies. (The same holds of two
// directly connected executors of a pool; a site is meant to be cut off
// from the cluster, and it is not cut off from its sibling sites.)
func TestTwoSitesOfAPoolSeeNoneOfEachOthersReplies(t *testing.T) {
	openHole(t, "A43-5: every executor of a pool is one user with one inbox prefix")
	h := hub(t)
	_, siteA := site(t, h, "executor")
	_, siteB := site(t, h, "executor")
	spied := make(chan *nats.Msg, 64)
	_, err := siteB.Subscribe("_INBOX_executor.>", func(m *nats.Msg) { spied <- m })
	require.NoError(t, err)
	require.NoError(t, siteB.Flush())
	// B's interest crosses its link asynchronously; A asks until B's
	// subscription is known to the hub or five seconds pass.
	var got *nats.Msg
	deadline := time.Now().Add(5 * time.Second)
	for got == nil && time.Now().Before(deadline) {
		_, err := siteA.Request("$JS.actionbus.API.STREAM.INFO.AB_WORK", nil, 2*time.Second)
		require.NoError(t, err, "site A's own request")
		select {
		case got = <-spied:
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got != nil {
		assert.Fail(t, "site B received site A's reply", "on %s: %.120s", got.Subject, got.Data)
	}
}

// TestASiteStoresItsPoolsArtifacts checks the path an oversized output
// takes from a site (E-ARTIFACT): the pool's object store, written
// through the leaf link with the cluster's JetStream domain, as the
// executor does. docs/operations.md says nats-server never lets $O.>
// cross a leaf link; the executor user's "$JS.actionbus.API.$O..." forms
// map to nothing on the hub (its domain mappings are for $KV and $OBJ).
// An object put and read back must work, or no site can hand over an
// output over the limit.
func TestASiteStoresItsPoolsArtifacts(t *testing.T) {
	h := hub(t)
	_, nc := site(t, h, "executor")
	js, err := jetstream.NewWithDomain(nc, "actionbus")
	require.NoError(t, err)
	ctx := ctxFor(t, 30*time.Second)
	os, err := js.ObjectStore(ctx, "ab_artifacts_default")
	require.NoError(t, err, "the site opens its pool's artifact store")
	data := []byte(strings.Repeat("x", 300_000))
	_, err = os.Put(ctx, jetstream.ObjectMeta{Name: "attack43-artifact"}, bytes.NewReader(data))
	require.NoError(t, err, "the site stores an artifact")
	admin, err := h.JS.ObjectStore(ctx, "ab_artifacts_default")
	require.NoError(t, err)
	back, err := admin.GetBytes(ctx, "attack43-artifact")
	require.NoError(t, err)
	assert.Equal(t, len(data), len(back))
}
