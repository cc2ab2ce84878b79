package process

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/cli"
)

// sniffer records every message a connection receives on everything its
// user may subscribe to.
type sniffer struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func sniff(t *testing.T, nc *nats.Conn, subjects []string) *sniffer {
	t.Helper()
	s := &sniffer{}
	for _, subject := range subjects {
		_, err := nc.Subscribe(subject, func(m *nats.Msg) {
			s.mu.Lock()
			s.msgs = append(s.msgs, m)
			s.mu.Unlock()
		})
		require.NoError(t, err)
	}
	require.NoError(t, nc.Flush())
	return s
}

func (s *sniffer) received() []*nats.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*nats.Msg(nil), s.msgs...)
}

// jsProbe is a JetStream API request a tenant tried in the review, and
// what it was after.
type jsProbe struct {
	subject, body, what string
}

// TestATenantAccountHoldsNothingOfTheServices runs the review's account
// attacks as the deployed tenant users (deploy/nats/accounts.conf: one
// account per tenant) against the four real service binaries, while
// tenant globex runs a run whose prompt carries a secret:
//
//   - acme's client and approver subscribe to all they may (their
//     account holds only what its imports bring in) and receive nothing of
//     globex's; a tenant cannot be named after a service, whose inbox a
//     tenant named "auditor" once read (finding 2);
//   - every JetStream API request the review used (stream info with a
//     subjects filter, direct gets with a literal "*", push consumers
//     delivering into another tenant's subjects or inboxes, durable
//     consumers by the hundred) reaches no JetStream of the services: the
//     tenant's account has none (findings 3, 4, 5), and the services'
//     streams hold exactly the consumers they had;
//   - a rollup header on acme's own request subject wipes nothing (the
//     ingress drops it);
//   - acme's account is bounded: its connections stop at the shipped
//     limit with a typed refusal, and the services go on.
func TestATenantAccountHoldsNothingOfTheServices(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts service processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := deployed(t, "acme", "globex")
	bin := buildServices(t)
	for _, svc := range []string{"dispatcher", "planner", "auditor"} {
		startService(t, filepath.Join(bin, svc), srv.UserURL(svc))
	}
	startTestExecutor(t, buildTestExecutor(t), srv.UserURL("executor"), t.TempDir(), "ex-1")

	acmeNC, _ := connectAs(t, srv.UserURL(natsconf.ClientUser("acme")), client.InboxPrefix("acme"))
	acmeApproverNC, _ := connectAs(t, srv.UserURL(natsconf.ApproverUser("acme")), client.InboxPrefix("acme"))
	heard := []*sniffer{sniff(t, acmeNC, accounts.ClientPermissions("ab", "acme").Sub),
		sniff(t, acmeApproverNC, accounts.ApproverPermissions("ab", "acme").Sub)}

	// Globex runs an action whose arguments carry a secret.
	gnc, _ := connectAs(t, srv.UserURL(natsconf.ClientUser("globex")), client.InboxPrefix("globex"))
	globex, err := client.New(gnc, client.Options{Tenant: "globex"})
	require.NoError(t, err)
	admin, err := client.New(srv.Conn, client.Options{})
	require.NoError(t, err)
	waitCatalog(t, ctx, admin, "test.other")
	const secret = "globex-secret-7f3a"
	res, err := globex.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.other", Args: map[string]any{}},
		UserID: "g1", Metadata: map[string]any{"note": secret}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	// Nothing acme's users heard meanwhile: their account holds only what
	// its imports bring in, and globex's run, the services' inboxes and
	// replies are not among it.
	require.NoError(t, acmeNC.Flush())
	for _, s := range heard {
		for _, m := range s.received() {
			t.Errorf("acme received %s: %.200s", m.Subject, m.Data)
		}
	}
	require.NoError(t, acmeNC.Drain())
	require.NoError(t, acmeApproverNC.Drain())
	acmeNC, _ = connectAs(t, srv.UserURL(natsconf.ClientUser("acme")), client.InboxPrefix("acme"))

	t.Run("a tenant cannot be named after a service", func(t *testing.T) {
		for _, name := range []string{"auditor", "dispatcher", "planner", "executor", "actionbus", "admin"} {
			var out, errOut strings.Builder
			code := cli.Execute(ctx, []string{"tenant", "users", name}, nil, &out, &errOut)
			assert.NotEqual(t, 0, code, "tenant %s was accepted:\n%s", name, out.String())
			assert.Empty(t, out.String())
		}
	})

	t.Run("the services' JetStream API is out of reach", func(t *testing.T) {
		probes := []jsProbe{
			{"$JS.API.INFO", "", "account info"},
			{"$JS.API.STREAM.NAMES", "", "stream names"},
			{"$JS.API.STREAM.LIST", "", "stream list"},
			{"$JS.API.STREAM.INFO.AB_RUNS", `{"subjects_filter":">"}`, "every tenant's run ids"},
			{"$JS.API.STREAM.INFO.AB_REQUESTS", `{"subjects_filter":">"}`, "every tenant's requests"},
			{"$JS.API.STREAM.INFO.AB_AUDIT", `{"subjects_filter":">"}`, "every tenant's audit subjects"},
			{"$JS.API.STREAM.INFO.OBJ_ab_artifacts", `{"subjects_filter":">"}`, "every artifact"},
			{"$JS.API.DIRECT.GET.OBJ_ab_artifacts.$O.ab_artifacts.M.*", "", "the newest artifact"},
			{"$JS.API.DIRECT.GET.AB_REQUESTS.ab.run.globex.*.requested", "", "globex's newest request"},
			{"$JS.API.STREAM.MSG.GET.AB_RUNS", `{"seq":1}`, "a stored event by sequence"},
			{"$JS.API.CONSUMER.CREATE.OBJ_ab_artifacts", `{"stream_name":"OBJ_ab_artifacts","config":{"deliver_subject":"_INBOX_acme.c","deliver_policy":"all","ack_policy":"none"}}`, "artifact chunks pushed to acme"},
			{"$JS.API.CONSUMER.CREATE.AB_RUNS.x.ab.run.acme.>", `{"stream_name":"AB_RUNS","config":{"name":"x","deliver_subject":"ab.stream.globex.` + res.RunID + `","filter_subject":"ab.run.acme.>","deliver_policy":"all","ack_policy":"none"}}`, "acme's bytes delivered into globex's subjects"},
			{"$JS.API.CONSUMER.DURABLE.CREATE.AB_RUNS.hoard", `{"stream_name":"AB_RUNS","config":{"durable_name":"hoard","ack_policy":"explicit"}}`, "a durable consumer"},
			{"$JS.API.STREAM.CREATE.MINE", `{"name":"MINE","subjects":["ab.run.acme.>"]}`, "a stream of its own"},
		}
		for _, p := range probes {
			// A refused publish gets no answer at all.
			msg, err := acmeNC.Request(p.subject, []byte(p.body), 500*time.Millisecond)
			if err == nil {
				// The only answer a tenant's account can give: it has no
				// JetStream.
				var reply struct {
					Error *struct {
						Code    int `json:"code"`
						ErrCode int `json:"err_code"`
					} `json:"error"`
				}
				require.NoError(t, json.Unmarshal(msg.Data, &reply), "%s: %s", p.what, msg.Data)
				require.NotNil(t, reply.Error, "acme got %s: %s", p.what, msg.Data)
				assert.Equal(t, 10039, reply.Error.ErrCode, "%s: %s", p.what, msg.Data) // JetStream not enabled for account
			}
			assert.NotContains(t, fmt.Sprint(msg), "globex", p.what)
		}
		// 300 durable consumers, as in the review: none is made.
		inbox := nats.NewInbox()
		for i := range 300 {
			require.NoError(t, acmeNC.PublishRequest(fmt.Sprintf("$JS.API.CONSUMER.DURABLE.CREATE.AB_RUNS.d%d", i), inbox,
				[]byte(fmt.Sprintf(`{"stream_name":"AB_RUNS","config":{"durable_name":"d%d","ack_policy":"explicit"}}`, i))))
		}
		require.NoError(t, acmeNC.Flush())
		for _, c := range jsConsumers(t, srv.Conn) {
			name := c[strings.Index(c, "/")+1:]
			assert.False(t, name == "x" || name == "hoard" || (strings.HasPrefix(name, "d") && len(name) <= 4), "acme made consumer %s", c)
		}
	})

	t.Run("a rollup on its own request subject wipes nothing", func(t *testing.T) {
		before := srv.Stored(t, "AB_REQUESTS", ">")
		id := events.NewID()
		m := forged(t, "ab.run.acme."+id+".requested", events.TypeRunRequested, id, events.NewID(),
			map[string]any{"runId": id, "prompt": "wipe"})
		m.Header.Set("Nats-Rollup", "all")
		reply, err := acmeNC.RequestMsg(m, 2*time.Second)
		require.NoError(t, err)
		// The ingress drops every Nats-* header: the request is stored
		// as any other, and nothing is rolled up.
		var ack struct {
			Seq   uint64          `json:"seq"`
			Error json.RawMessage `json:"error"`
		}
		require.NoError(t, json.Unmarshal(reply.Data, &ack), "%s", reply.Data)
		require.Nil(t, ack.Error, "%s", reply.Data)
		assert.Equal(t, before+1, srv.Stored(t, "AB_REQUESTS", ">"), "the stream rolled up on a tenant's header")
		assert.GreaterOrEqual(t, srv.Stored(t, "AB_REQUESTS", "ab.run.globex.>"), 1, "globex's request is still stored")
		st, err := srv.JS.Stream(ctx, "AB_REQUESTS")
		require.NoError(t, err)
		stored, err := st.GetMsg(ctx, ack.Seq)
		require.NoError(t, err)
		assert.Empty(t, stored.Header.Get("Nats-Rollup"), "the rollup header was stored")
	})

	t.Run("its connections are bounded", func(t *testing.T) {
		var refused error
		for i := 0; i < 300 && refused == nil; i++ {
			nc, err := nats.Connect(srv.UserURL(natsconf.ClientUser("acme")), nats.NoReconnect())
			if err != nil {
				refused = err
				break
			}
			t.Cleanup(nc.Close)
		}
		require.Error(t, refused, "acme opened 300 connections")
		assert.Contains(t, refused.Error(), "maximum account active connections exceeded")
		// Globex and the services are not affected.
		res, err := globex.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.other", Args: map[string]any{}}, UserID: "g1"}, nil)
		require.NoError(t, err)
		assert.Equal(t, client.StatusCompleted, res.Status)
	})

}

// jsConsumers returns the names of the consumers of every stream of the
// services' account, as its admin sees them.
func jsConsumers(t *testing.T, admin *nats.Conn) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := admin.RequestWithContext(ctx, "$JS.API.STREAM.NAMES", nil)
	require.NoError(t, err)
	var names struct {
		Streams []string `json:"streams"`
	}
	require.NoError(t, json.Unmarshal(msg.Data, &names))
	var out []string
	for _, s := range names.Streams {
		msg, err := admin.RequestWithContext(ctx, "$JS.API.CONSUMER.NAMES."+s, nil)
		require.NoError(t, err)
		var cs struct {
			Consumers []string `json:"consumers"`
		}
		require.NoError(t, json.Unmarshal(msg.Data, &cs))
		for _, c := range cs.Consumers {
			out = append(out, s+"/"+c)
		}
	}
	return out
}
