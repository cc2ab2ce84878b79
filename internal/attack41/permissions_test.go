package attack41_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
)

// deniedConn connects as user and records the subjects the server
// refused it (permissions violations, reported asynchronously).
type deniedConn struct {
	nc     *nats.Conn
	mu     sync.Mutex
	denied []string
}

func connectAs(t *testing.T, srv *actionbustest.Server, user, tenant string) *deniedConn {
	d := &deniedConn{}
	opts := []nats.Option{nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		d.mu.Lock()
		d.denied = append(d.denied, err.Error())
		d.mu.Unlock()
	})}
	if tenant != "" {
		opts = append(opts, nats.CustomInboxPrefix("_INBOX_"+tenant))
	} else {
		opts = append(opts, nats.CustomInboxPrefix("_INBOX_"+user))
	}
	nc, err := nats.Connect(srv.UserURL(user), opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	d.nc = nc
	return d
}

// refused publishes on subject (with a reply subject, as a request) and waits for the
// server's permissions violation naming it.
func (d *deniedConn) refused(t *testing.T, subject string, data []byte) bool {
	t.Helper()
	require.NoError(t, d.nc.PublishRequest(subject, d.nc.NewRespInbox(), data))
	_ = d.nc.Flush()
	return assert.Eventually(t, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, e := range d.denied {
			if strings.Contains(e, "Permissions Violation") && strings.Contains(e, `"`+subject+`"`) {
				return true
			}
		}
		return false
	}, 3*time.Second, 10*time.Millisecond, "%s may publish %s", d.nc.Opts.User, subject)
}

// TestAttack41_OnlyDispatchersTouchPartitionsAndPresence: every deployed
// user but the dispatcher's (an executor of any pool, the planner, the
// auditor, a tenant's client and approver) tries what would steer the
// partitions: write a presence key into ab_dispatchers (a fake member
// takes partitions from live dispatchers), unpin a partition consumer
// (hand a partition to whoever pulls next), pull a partition consumer
// (take a partition's events), and publish a run event on its stored,
// six-token subject (skip the transform, pick a partition). Each is
// refused by the server, and nothing is stored.
func TestAttack41_OnlyDispatchersTouchPartitionsAndPresence(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Partitions: 4})
	runID := events.NewID()
	for _, user := range []string{"executor", "planner", "auditor", "client", "approver"} {
		t.Run(user, func(t *testing.T) {
			tenant := ""
			if user == "client" || user == "approver" {
				tenant = events.DefaultTenant
			}
			d := connectAs(t, srv, user, tenant)
			d.refused(t, "$KV.ab_dispatchers.evil-member", []byte("now"))
			d.refused(t, "$JS.API.CONSUMER.UNPIN.AB_RUNS.dispatcher-p0", []byte(`{"group":"owner"}`))
			d.refused(t, "$JS.API.CONSUMER.UNPIN.AB_REQUESTS.dispatcher-requests-p1", []byte(`{"group":"owner"}`))
			d.refused(t, "$JS.API.CONSUMER.MSG.NEXT.AB_RUNS.dispatcher-p2", []byte(`{"batch":1,"group":"owner"}`))
			d.refused(t, "$JS.API.CONSUMER.MSG.NEXT.AB_TIMERS.dispatcher-timers-p3", []byte(`{"batch":1,"group":"owner"}`))
			d.refused(t, "ab.run.default."+runID+".result.1", []byte(`{}`))
			d.refused(t, "ab.run.default."+runID+".requested.1", []byte(`{}`))
			d.refused(t, "ab.ingress.default."+runID+".requested", []byte(`{}`))
		})
	}
	kv, err := srv.JS.KeyValue(ctxFor(t, 10*time.Second), "ab_dispatchers")
	require.NoError(t, err)
	_, err = kv.Get(ctxFor(t, 10*time.Second), "evil-member")
	assert.Error(t, err, "no presence was written")
	for _, stream := range []string{"AB_RUNS", "AB_REQUESTS", "AB_TIMERS"} {
		assert.Zero(t, srv.Stored(t, stream, "ab.run.default."+runID+".*"), stream)
	}
}
