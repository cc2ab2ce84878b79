package dispatch_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
)

// A push consumer delivers to the subject its creator names in the
// create request's body, in the account of the stream: the services'
// account, whatever account the creator lives in, since no import
// rewrites a body. The planner and the auditor create push consumers of
// the catalog (their watches), so each can name any subject of ACTIONBUS.
// The server delivers there while a subscriber of ACTIONBUS itself has
// interest in the subject, and then the stream that holds the subject
// stores what is delivered: the catalog's entries, and an empty idle
// heartbeat every interval. Checked on 2026-12-07 with an admin
// subscriber on a run's completed subject and on a run state's key: 40
// messages stored on the one in two seconds, the run state overwritten
// with an empty value. A tenant's client following its run subscribes in
// its own account, which gives ACTIONBUS no such interest: nothing is
// delivered or stored, which this test holds. (docs/security.md, "What is
// left": no subscriber of ACTIONBUS may listen on a stored subject, and
// the fix that needs no such rule is that neither service creates
// consumers in ACTIONBUS.)
func TestNoServiceUserAimsAConsumersDeliveriesAtATenantsRun(t *testing.T) {
	const run = "01JATTACKRUN0000000000000"
	target := "ab.run.acme." + run + ".completed"
	for i, user := range []string{"planner", "auditor"} {
		t.Run(user, func(t *testing.T) {
			srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
			ctx := ctxT(t)
			catalog, err := srv.JS.KeyValue(ctx, "ab_catalog")
			require.NoError(t, err)
			_, err = catalog.Put(ctx, "default.attack", []byte(`{}`))
			require.NoError(t, err)
			// Acme's client follows its run: interest on the run's
			// subjects, in ACTIONBUS through acme's import.
			follower, err := nats.Connect(srv.UserURL("client-acme"), nats.CustomInboxPrefix("_INBOX_acme"))
			require.NoError(t, err)
			t.Cleanup(follower.Close)
			heard := make(chan *nats.Msg, 64)
			_, err = follower.ChanSubscribe("ab.run.acme."+run+".*", heard)
			require.NoError(t, err)
			require.NoError(t, follower.Flush())

			nc, err := nats.Connect(srv.UserURL(user), nats.CustomInboxPrefix("_INBOX_"+user))
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			name := fmt.Sprintf("attack%d", i)
			body := fmt.Sprintf(`{"stream_name":"KV_ab_catalog","config":{"name":%q,"deliver_subject":%q,"deliver_policy":"all","ack_policy":"none","idle_heartbeat":100000000,"flow_control":true}}`, name, target)
			_, _ = nc.Request("$JS.API.CONSUMER.CREATE.KV_ab_catalog."+name, []byte(body), 5*time.Second)

			runs, err := srv.JS.Stream(ctx, "AB_RUNS")
			require.NoError(t, err)
			assert.Never(t, func() bool {
				info, err := runs.Info(ctx)
				return len(heard) > 0 || err == nil && info.State.Msgs > 0
			}, 1500*time.Millisecond, 50*time.Millisecond, "the %s user had the server store or deliver on %s", user, target)
		})
	}
}
