package dispatch_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
)

// A push consumer delivers to the subject its create request's body
// names, in the account of the stream: the services' account, whatever
// account the creator lives in, since no import rewrites a body. The server
// delivers there while a subscriber of ACTIONBUS has interest in the
// subject, and the stream that holds the subject then stores what is
// delivered: the stream's messages and an empty idle heartbeat every
// interval (checked on 2026-12-07: 40 messages stored on a run's completed
// subject in two seconds, a run state overwritten with an empty value).
// The planner and the auditor created such consumers to watch the catalog,
// and the auditor its sinks' consumers. They now follow the catalog with
// direct gets and pull from sink consumers provisioning created, and their
// users may create no consumer (accounts.ConsumerCreators). This test
// gives the attack its best case — an admin subscriber of ACTIONBUS
// listening on the target, and acme's follower — and holds that nothing
// is delivered or stored, for a push consumer of the catalog and of the
// audit stream.
func TestNoServiceUserAimsAConsumersDeliveriesAtATenantsRun(t *testing.T) {
	const run = "01JATTACKRUN0000000000000"
	target := "ab.run.acme." + run + ".completed"
	// Each in the create's form with a filter, as the auditor's grant
	// on its sinks' consumers read (CONSUMER.CREATE.AB_AUDIT.sink-jsonl.>).
	attacks := []struct{ user, stream, name, filter string }{
		{"planner", "KV_ab_catalog", "attack0", "$KV.ab_catalog.>"},
		{"auditor", "KV_ab_catalog", "attack1", "$KV.ab_catalog.>"},
		{"auditor", "AB_AUDIT", "sink-jsonl", "ab.audit.>"},
	}
	for _, a := range attacks {
		t.Run(a.user+"/"+a.stream, func(t *testing.T) {
			srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
			ctx := ctxT(t)
			catalog, err := srv.JS.KeyValue(ctx, "ab_catalog")
			require.NoError(t, err)
			_, err = catalog.Put(ctx, "default.attack", []byte(`{}`))
			require.NoError(t, err)
			_, err = srv.JS.Publish(ctx, "ab.audit.acme."+run+".records", []byte(`{}`))
			require.NoError(t, err)
			// An operator's tool listening on the run's subjects: interest
			// in ACTIONBUS itself.
			admin, err := nats.Connect(srv.UserURL("admin"))
			require.NoError(t, err)
			t.Cleanup(admin.Close)
			heard := make(chan *nats.Msg, 64)
			_, err = admin.ChanSubscribe("ab.run.acme."+run+".*", heard)
			require.NoError(t, err)
			require.NoError(t, admin.Flush())
			// Acme's client follows its run: interest in its own account.
			follower, err := nats.Connect(srv.UserURL("client-acme"), nats.CustomInboxPrefix("_INBOX_acme"))
			require.NoError(t, err)
			t.Cleanup(follower.Close)
			_, err = follower.ChanSubscribe("ab.run.acme."+run+".*", heard)
			require.NoError(t, err)
			require.NoError(t, follower.Flush())

			nc, err := nats.Connect(srv.UserURL(a.user), nats.CustomInboxPrefix("_INBOX_"+a.user))
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			body := fmt.Sprintf(`{"stream_name":%q,"config":{"name":%q,"durable_name":%[2]q,"filter_subject":%q,"deliver_subject":%q,"deliver_policy":"all","ack_policy":"none","idle_heartbeat":100000000,"flow_control":true}}`, a.stream, a.name, a.filter, target)
			_, _ = nc.Request("$JS.API.CONSUMER.CREATE."+a.stream+"."+a.name+"."+a.filter, []byte(body), 2*time.Second)

			runs, err := srv.JS.Stream(ctx, "AB_RUNS")
			require.NoError(t, err)
			assert.Never(t, func() bool {
				info, err := runs.Info(ctx)
				return len(heard) > 0 || err == nil && info.State.Msgs > 0
			}, 1500*time.Millisecond, 50*time.Millisecond, "the %s user had the server store or deliver on %s", a.user, target)
			// No such consumer, or (a sink's) the pull consumer
			// provisioning created, unchanged.
			if cons, err := srv.JS.Consumer(ctx, a.stream, a.name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
				require.NoError(t, err)
				assert.Empty(t, cons.CachedInfo().Config.DeliverSubject, "the %s user made %s/%s deliver", a.user, a.stream, a.name)
			}
		})
	}
}
