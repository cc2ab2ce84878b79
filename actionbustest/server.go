// Package actionbustest runs actionbus against a real embedded nats-server
// with JetStream inside a Go test: one fresh server per test, provisioned,
// shut down in t.Cleanup, and helpers that wait for events with deadlines
// instead of sleeping.
//
// It is for tests only. It never mocks NATS: everything a test publishes
// goes through a real JetStream server.
package actionbustest

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/ingress"
)

// Options configures [NewServer].
type Options struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Pools are the executor pools to provision; default ["default"].
	Pools []string
	// Partitions the runs are spread over ([bus.Topology.Partitions]);
	// default 1.
	Partitions int
	// SkipProvision leaves the server empty (no streams, consumers or
	// buckets), for tests of provisioning itself.
	SkipProvision bool
	// AckWait of every consumer; default 30s. Tests of redelivery after a
	// crash use a short one.
	AckWait time.Duration
	// DuplicateWindow of every stream; default 2 minutes. Tests of what
	// happens once JetStream no longer drops a republished event use a
	// short one (at least twice AckWait, or admissions hand their work out
	// only after their state is stored).
	DuplicateWindow time.Duration
	// MaxPayload is the server's largest message; default the server's
	// own default (1 MB), the limit a deployment meets.
	MaxPayload int32
	// Users starts the server with the accounts and least-privilege users
	// of deploy/nats/accounts.conf (the password of user u is "pw-u"):
	// [Server.UserURL] connects as one of them, Conn and JS are the admin
	// user's, and provisioning runs as admin. Attacks on the trust rules
	// are tested this way, as the deployed users.
	Users bool
	// Tenants adds, with Users, the client and approver users of these
	// tenants (deploy/nats/tenant-users.conf.tmpl): "client-<tenant>" and
	// "approver-<tenant>", password "pw-<user>" as for the others. They
	// connect with [Server.TenantConnect].
	Tenants []string
	// Operator starts the server in operator mode (JWTs, a full account
	// resolver) from an operator store made for the test: the ACTIONBUS
	// account holds every stream, Conn and JS are its admin user's, and
	// provisioning runs as admin. [Server.TenantAdd] adds a tenant account
	// at run time, with no restart, as `actionbus tenant add` does;
	// [Server.ServiceConnect] connects as a service user. Excludes Users.
	Operator bool
	// LeafNodes makes the server a hub that accepts leaf node
	// connections on a free loopback port ([Server.LeafURL]), with the
	// deployment's JetStream domain, as deploy/nats's nodes do on 7422.
	LeafNodes bool
}

func (o *Options) setDefaults() {
	if o.Prefix == "" {
		o.Prefix = events.DefaultPrefix
	}
	if len(o.Pools) == 0 {
		o.Pools = []string{bus.DefaultPool}
	}
}

// Server is an embedded JetStream server for one test.
type Server struct {
	// NATS is the embedded server.
	NATS *server.Server
	// URL is the client URL of the server (nats://127.0.0.1:<port>).
	URL string
	// Conn is a connection owned by the test; closed in t.Cleanup.
	Conn *nats.Conn
	// JS is a JetStream context on Conn.
	JS jetstream.JetStream
	// Prefix is the subject prefix in use.
	Prefix string
	// Pools are the provisioned executor pools.
	Pools []string

	users bool
	// OperatorDir is the operator store of a server started with
	// Options.Operator, as `actionbus nats init --dir` makes it: the
	// `actionbus tenant` commands take it as their --dir. Empty
	// otherwise.
	OperatorDir string

	accounts *accounts.Store
	sys      *nats.Conn
	sysMu    sync.Mutex
}

// NewServer starts an embedded nats-server with JetStream on a free
// loopback port and a store in t.TempDir(), connects to it and (unless
// o.SkipProvision) provisions every stream, consumer and bucket; the zero
// Options are the defaults. The
// server and connection are shut down in t.Cleanup.
func NewServer(t testing.TB, o Options) *Server {
	t.Helper()
	o.setDefaults()
	eo := embedded.Options{Port: -1, StoreDir: t.TempDir(), MaxPayload: o.MaxPayload}
	if o.LeafNodes {
		eo.LeafNodePort, eo.JetStreamDomain = -1, accounts.JetStreamDomain
	}
	if o.Users {
		conf := filepath.Join(t.TempDir(), "accounts.conf")
		users := append(append([]string{}, natsconf.Users...), natsconf.TenantUserNames(o.Tenants...)...)
		text := natsconf.WithPasswords(natsconf.WithTenants(o.Tenants...), users, userPassword)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatalf("actionbustest: write accounts.conf: %v", err)
		}
		eo.ConfigFile = conf
	}
	var store *accounts.Store
	if o.Operator {
		var err error
		if store, err = accounts.Init(filepath.Join(t.TempDir(), "operator"), accounts.InitOptions{Prefix: o.Prefix, Pools: o.Pools}); err != nil {
			t.Fatalf("actionbustest: operator store: %v", err)
		}
		eo.OperatorDir = store.Dir
	}
	ns, err := embedded.Start(eo)
	if err != nil {
		t.Fatalf("actionbustest: start nats-server: %v", err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	s := &Server{NATS: ns, URL: ns.ClientURL(), Prefix: o.Prefix, Pools: o.Pools, users: o.Users, accounts: store}
	if store != nil {
		s.OperatorDir = store.Dir
	}
	if o.Users {
		s.URL = s.UserURL("admin")
	}
	s.Conn = s.Connect(t)
	s.JS, err = jetstream.New(s.Conn)
	if err != nil {
		t.Fatalf("actionbustest: jetstream: %v", err)
	}
	if !o.SkipProvision {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		topo := bus.Topology{Prefix: o.Prefix, Pools: o.Pools, AckWait: o.AckWait, DuplicateWindow: o.DuplicateWindow, Partitions: o.Partitions}
		if err := topo.Provision(ctx, s.JS); err != nil {
			t.Fatalf("actionbustest: provision: %v", err)
		}
	}
	return s
}

// LeafURL is the URL a leaf node's remote connects to the server with,
// as user (a user of deploy/nats/accounts.conf on a server started with
// Options.Users; the link is that user's, bound to its account and
// permissions). It is "" unless the server was started with
// Options.LeafNodes.
func (s *Server) LeafURL(user string) string {
	vz, err := s.NATS.Varz(nil)
	if err != nil || vz.LeafNode.Port <= 0 {
		return ""
	}
	hp := net.JoinHostPort(vz.LeafNode.Host, strconv.Itoa(vz.LeafNode.Port))
	if !s.users {
		return "nats-leaf://" + hp
	}
	return "nats-leaf://" + user + ":" + userPassword(user) + "@" + hp
}

// userPassword is the password of a deployed user on a [Server] started
// with Options.Users.
func userPassword(user string) string { return "pw-" + user }

// UserURL is the URL that connects as one of the users of
// deploy/nats/accounts.conf (admin, dispatcher, planner, executor,
// auditor, client, approver) on a server started with Options.Users; on
// any other server it is URL.
func (s *Server) UserURL(user string) string {
	if !s.users {
		return s.URL
	}
	u, err := url.Parse(s.NATS.ClientURL())
	if err != nil {
		return s.URL
	}
	u.User = url.UserPassword(user, userPassword(user))
	return u.String()
}

// TenantConnect connects as user (see [Server.UserURL]) with the reply
// inbox prefix of tenant (nats.CustomInboxPrefix("_INBOX_<tenant>")), as
// a tenant's client and approver users must; closed in t.Cleanup.
func (s *Server) TenantConnect(t testing.TB, user, tenant string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.UserURL(user), nats.Name(t.Name()), nats.CustomInboxPrefix("_INBOX_"+events.TenantOr(tenant)))
	if err != nil {
		t.Fatalf("actionbustest: connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Connect opens another connection to the server (in operator mode as
// ACTIONBUS's admin), closed in t.Cleanup.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.Name(t.Name())}
	if s.accounts != nil {
		opts = append(opts, nats.UserCredentials(s.accounts.CredsFile(accounts.ServiceAccount, "admin")))
	}
	nc, err := nats.Connect(s.URL, opts...)
	if err != nil {
		t.Fatalf("actionbustest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// ServeIngress serves the ingress (internal/ingress) on a connection of
// its own until the test ends: the requests stream's only writer, which
// every dispatcher of [Server.StartStack] serves too. Tests that publish
// client events (run.requested, cancel, input, approve, deny) without a
// dispatcher call it.
func (s *Server) ServeIngress(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	requests, err := s.JS.Stream(ctx, bus.Topology{Prefix: s.Prefix}.StreamRequests())
	if err != nil {
		t.Fatalf("actionbustest: ingress: the requests stream: %v", err)
	}
	in, err := ingress.New(s.Connect(t), ingress.Config{Prefix: s.Prefix, MarkFirstOfRun: ingress.MarksFirstOfRun(requests.CachedInfo().Config)})
	if err != nil {
		t.Fatalf("actionbustest: ingress: %v", err)
	}
	if err := in.Start(); err != nil {
		t.Fatalf("actionbustest: ingress: %v", err)
	}
	t.Cleanup(in.Stop)
}

// Stored returns how many messages stream holds on the subjects that
// filter matches (a subject or a wildcard): what a test reads to see that
// something was written, or removed, without consuming it. A run event is
// matched by the subject it was published on: the partition token the
// streams store it with is not part of filter.
func (s *Server) Stored(t testing.TB, stream, filter string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.JS.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("actionbustest: stream %s: %v", stream, err)
	}
	filters := []string{filter}
	if !strings.HasSuffix(filter, ">") {
		filters = append(filters, filter+".*")
	}
	n := 0
	for _, f := range filters {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			t.Fatalf("actionbustest: stream %s, subjects %s: %v", stream, f, err)
		}
		for _, c := range info.State.Subjects {
			n += int(c)
		}
	}
	return n
}
