package accounts_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/ingress"
)

// pubAck is JetStream's publish acknowledgement (or its error).
type pubAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Error  *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// serveIngress serves the ingress on nc (as the dispatcher does): the
// requests stream's only writer, which answers a tenant's request with
// the stream's publish ack.
func serveIngress(t *testing.T, nc *nats.Conn) {
	t.Helper()
	in, err := ingress.New(nc, ingress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Stop)
}

// unrestricted signs a user of account with no permissions at all: what
// the account itself allows, whatever a user's lists say.
func unrestricted(t *testing.T, s *actionbustest.Server, account string) *nats.Conn {
	t.Helper()
	creds, err := operatorStore(t, s).SignUser(account, accounts.User{Name: "unrestricted-" + account})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "u.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := s.DialCreds(path, nats.Name(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// A tenant added while the server runs (no restart) publishes a run
// request and gets the ACTIONBUS stream's publish ack through its import,
// receives its runs' events published by a service user, and reaches
// nothing of another tenant nor any JetStream API.
func TestTenantAddedAtRunTimeCrossesOnlyItsOwnImports(t *testing.T) {
	s := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	topo := bus.Topology{Prefix: s.Prefix}
	srv := s.NATS

	serveIngress(t, s.ServiceConnect(t, "dispatcher"))
	acme := s.TenantAdd(t, "acme", actionbustest.TenantLimits{})
	if s.NATS != srv || !srv.Running() {
		t.Fatal("the server was replaced")
	}

	live, err := acme.SubscribeSync("ab.run.acme.*.started")
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.Flush(); err != nil {
		t.Fatal(err)
	}

	// The request crosses the service import into ACTIONBUS's stream, and
	// JetStream's ack comes back as the service's reply.
	run := events.NewID()
	msg := nats.NewMsg("ab.run.acme." + run + ".requested")
	msg.Header.Set("Nats-Msg-Id", run)
	msg.Data = []byte(`{}`)
	reply, err := acme.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatalf("acme's request got no ack: %v", err)
	}
	var ack pubAck
	if err := json.Unmarshal(reply.Data, &ack); err != nil || ack.Error != nil || ack.Stream != topo.StreamRequests() || ack.Seq == 0 {
		t.Fatalf("ack %s (%v)", reply.Data, err)
	}
	if n := s.Stored(t, topo.StreamRequests(), "ab.run.acme.>"); n != 1 {
		t.Fatalf("AB_REQUESTS holds %d of acme's requests, want 1", n)
	}

	// A service user's event on acme's run reaches acme's subscriber
	// through the stream import.
	dispatcher := s.ServiceConnect(t, "dispatcher")
	if err := dispatcher.Publish("ab.run.acme."+run+".started", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	got, err := live.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("acme did not receive its run's started event: %v", err)
	}
	if got.Subject != "ab.run.acme."+run+".started" {
		t.Fatalf("received %s", got.Subject)
	}

	// The client user may not publish another tenant's requests; and even
	// a user of acme's account with no permission lists reaches no import
	// for globex: no responders, nothing stored.
	other := events.NewID()
	if _, err := acme.Request("ab.run.globex."+other+".requested", []byte(`{}`), time.Second); err == nil {
		t.Fatal("acme's client published globex's request and got a reply")
	}
	free := unrestricted(t, s, "acme")
	if _, err := free.Request("ab.run.globex."+other+".requested", []byte(`{}`), time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("an unrestricted acme user's globex request: %v, want no responders", err)
	}
	if n := s.Stored(t, topo.StreamRequests(), "ab.run.globex.>"); n != 0 {
		t.Fatalf("AB_REQUESTS holds %d globex requests from acme", n)
	}

	// No JetStream in a tenant account, whatever the user may publish.
	if _, err := acme.Request("$JS.API.INFO", nil, time.Second); err == nil {
		t.Fatal("acme's client called $JS.API.INFO")
	}
	info, err := free.Request("$JS.API.INFO", nil, 2*time.Second)
	if err != nil || !strings.Contains(string(info.Data), "JetStream not enabled for account") {
		t.Fatalf("$JS.API.INFO in acme's account: %v, want the server's \"JetStream not enabled for account\"", err)
	}

	// Nothing of globex reaches acme: not even a user of acme's account
	// subscribed to everything. The marker on acme's own subject, sent
	// after globex's events by the same connection, bounds the wait.
	s.TenantAdd(t, "globex", actionbustest.TenantLimits{})
	all, err := free.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := free.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"ab.run.globex." + other + ".started", "ab.stream.globex." + other, "ab.audit.globex." + other + ".x", "ab.run.globex." + other + ".sched.k"} {
		if err := dispatcher.Publish(subj, []byte(`secret`)); err != nil {
			t.Fatal(err)
		}
	}
	marker := "ab.run.acme." + run + ".completed"
	if err := dispatcher.Publish(marker, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := all.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("the marker did not arrive: %v", err)
		}
		if strings.Contains(m.Subject, "globex") {
			t.Fatalf("acme received %s", m.Subject)
		}
		if m.Subject == marker {
			break
		}
	}
}

// Removing a tenant closes its users' connections at once and refuses
// them afterwards; the server keeps running.
func TestRemovedTenantIsDisconnectedAndCannotReconnect(t *testing.T) {
	s := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	closed := make(chan struct{})
	s.TenantAdd(t, "acme", actionbustest.TenantLimits{})
	acme := s.TenantUserConnect(t, "acme", accounts.ClientUser("acme"), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	creds, err := os.ReadFile(operatorStore(t, s).CredsFile("acme", accounts.ClientUser("acme")))
	if err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(t.TempDir(), "client-acme.creds")
	if err := os.WriteFile(kept, creds, 0o600); err != nil {
		t.Fatal(err)
	}

	s.TenantRemove(t, "acme")
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("acme's connection is still open after tenant remove")
	}
	if acme.IsConnected() {
		t.Fatal("acme is connected")
	}
	if nc, err := s.DialCreds(kept, nats.Name(t.Name())); err == nil {
		nc.Close()
		t.Fatal("a removed tenant's client connected again")
	}
	// Its name is not given to a new tenant unless the operator says so:
	// what the removed acme left is still stored under it.
	if _, err := operatorStore(t, s).AddTenant("acme", accounts.Limits{}); err == nil || !strings.Contains(err.Error(), "was removed") {
		t.Fatalf("a removed tenant's name was given again: %v", err)
	}
	if err := operatorStore(t, s).ReuseName("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := operatorStore(t, s).AddTenant("acme", accounts.Limits{}); err != nil {
		t.Fatalf("the operator's reuse of a removed tenant's name: %v", err)
	}
	if _, err := operatorStore(t, s).AddTenant("initech", accounts.Limits{MaxConnections: -1}); err == nil {
		t.Fatal("a tenant without a connection limit (-1) was added")
	}
	if err := s.Conn.Flush(); err != nil {
		t.Fatalf("the services' connection: %v", err)
	}
}

// A tenant account at its connection limit refuses the next connection
// with the server's clear error.
func TestTenantConnectionLimitRefusesTheNextOne(t *testing.T) {
	s := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	const limit = 3
	s.TenantAdd(t, "acme", actionbustest.TenantLimits{MaxConnections: limit})
	for i := 1; i < limit; i++ {
		s.TenantUserConnect(t, "acme", accounts.ApproverUser("acme"))
	}
	nc, err := s.DialCreds(operatorStore(t, s).CredsFile("acme", accounts.ClientUser("acme")), nats.Name(t.Name()))
	if err == nil {
		nc.Close()
		t.Fatalf("connection %d of acme accepted, limit %d", limit+1, limit)
	}
	if !errors.Is(err, nats.ErrMaxAccountConnectionsExceeded) {
		t.Fatalf("connection %d refused with %v, want %v", limit+1, err, nats.ErrMaxAccountConnectionsExceeded)
	}
}

// A tenant added while the services run (each as its own ACTIONBUS user)
// starts a run with the Go client over its own connection (the publish
// ack crosses its service import) and follows it live: its run's events,
// published by the services in ACTIONBUS, reach it through its stream
// import, up to the terminal event.
func TestTenantAddedAtRunTimeStartsARunAndFollowsItLive(t *testing.T) {
	s := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	s.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		type in struct {
			Text string `json:"text"`
		}
		return executor.Register(ex, executor.Action{Name: "t.echo", Description: "Echo."},
			func(_ context.Context, x in, _ executor.Call) (executor.Result[in], error) {
				return executor.Result[in]{Output: x, Summary: x.Text}, nil
			})
	}})
	acme := s.TenantAdd(t, "acme", actionbustest.TenantLimits{})
	run := events.NewID()
	live, err := acme.SubscribeSync("ab.run.acme." + run + ".*")
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(acme, client.Options{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Start(ctx, client.RunRequest{RunID: run, Action: &client.ActionCall{Name: "t.echo", Args: map[string]any{"text": "hi"}}}); err != nil {
		t.Fatalf("acme's client could not start a run: %v", err)
	}
	var verbs []string
	for {
		m, err := live.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("acme's run did not end live (saw %v): %v", verbs, err)
		}
		verb := m.Subject[strings.LastIndex(m.Subject, ".")+1:]
		verbs = append(verbs, verb)
		if verb == "failed" || verb == "canceled" {
			t.Fatalf("acme's run ended %s: %s", verb, m.Data)
		}
		if verb == "completed" {
			break
		}
	}
	if !slices.Contains(verbs, "started") {
		t.Fatalf("acme saw %v, not its run's started event", verbs)
	}
}

// An account JWT that the operator signs by mistake with an import of
// another tenant's subjects gains nothing: ACTIONBUS's exports require an
// activation token narrowed to the importing tenant. With the token of its
// own subjects the server refuses the account (account_refused); with no
// token it accepts the account but not the import: no responders, no
// events of globex, while its own token-activated import works.
func TestAnImportOfAnotherTenantsSubjectsWithoutItsActivationIsRefused(t *testing.T) {
	s := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	serveIngress(t, s.ServiceConnect(t, "dispatcher"))
	s.TenantAdd(t, "globex", actionbustest.TenantLimits{})
	seed := func(path string) nkeys.KeyPair {
		b, err := os.ReadFile(filepath.Join(operatorStore(t, s).Dir, path))
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(b)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	operator, svc := seed("operator.nk"), seed("accounts/ACTIONBUS/account.nk")
	svcPub, _ := svc.PublicKey()
	sys, err := s.DialCreds(operatorStore(t, s).CredsFile(accounts.SystemAccount, accounts.SystemUser))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	// mallory signs tenant's account with extra imports and pushes it.
	mallory := func(tenant string, extra func(own string) []*jwt.Import) (nkeys.KeyPair, error) {
		akp, _ := nkeys.CreateAccount()
		pub, _ := akp.PublicKey()
		ac, err := accounts.TenantAccountClaims("ab", tenant, pub, accounts.Exporters{accounts.ServiceAccount: svc,
			accounts.PlannerAccount: seed("accounts/PLANNER/account.nk"), accounts.AuditorAccount: seed("accounts/AUDITOR/account.nk"),
			accounts.PoolAccount("default"): seed("accounts/POOL_default/account.nk")}, accounts.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		ac.Imports.Add(extra(ac.Imports[0].Token)...) // Imports[0]: ab.run.<tenant>.*.requested
		tok, err := ac.Encode(operator)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return akp, accounts.Push(ctx, sys, tok)
	}

	_, err = mallory("mallory1", func(own string) []*jwt.Import {
		return []*jwt.Import{{Name: "stolen", Subject: "ab.run.globex.*.requested", Account: svcPub, Token: own, Type: jwt.Service}}
	})
	if actionbus.CodeOf(err) != actionbus.CodeAccountRefused {
		t.Fatalf("an import of globex's subjects with another tenant's token: %v, want account_refused", err)
	}

	akp, err := mallory("mallory", func(string) []*jwt.Import {
		return []*jwt.Import{{Name: "untokened", Subject: "ab.run.globex.*.requested", Account: svcPub, Type: jwt.Service},
			{Name: "untokened events", Subject: "ab.run.globex.*.*", Account: svcPub, Type: jwt.Stream}}
	})
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	creds, _, err := accounts.Creds(accounts.User{Name: "mallory"}, akp)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := s.DialCreds(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	run := events.NewID()
	if _, err := m.Request("ab.run.globex."+run+".requested", []byte(`{}`), time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("mallory's request on globex's subject: %v, want no responders", err)
	}
	topo := bus.Topology{Prefix: s.Prefix}
	if n := s.Stored(t, topo.StreamRequests(), "ab.run.globex.>"); n != 0 {
		t.Fatalf("mallory stored %d globex requests", n)
	}
	// Its own, token-activated import works: the refusal above is the
	// token's, not a broken account.
	if _, err := m.Request("ab.run.mallory."+run+".requested", []byte(`{}`), 5*time.Second); err != nil {
		t.Fatalf("mallory's own import: %v", err)
	}
	all, err := m.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	dispatcher := s.ServiceConnect(t, "dispatcher")
	if err := dispatcher.Publish("ab.run.globex."+run+".started", []byte(`secret`)); err != nil {
		t.Fatal(err)
	}
	// The marker, on mallory's own subject after globex's event from the
	// same connection, bounds the wait.
	marker := "ab.run.mallory." + run + ".started"
	if err := dispatcher.Publish(marker, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := all.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("the marker did not arrive: %v", err)
		}
		if strings.Contains(msg.Subject, "globex") {
			t.Fatalf("mallory received globex's %s", msg.Subject)
		}
		if msg.Subject == marker {
			break
		}
	}
}

// A tenant account's subscription and payload limits hold: the
// subscription over the limit is refused with the server's "maximum
// subscriptions exceeded", a message over the account's max payload with
// "maximum payload".
func TestTenantSubscriptionAndPayloadLimitsHold(t *testing.T) {
	s := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	const subs, payload = 4, 1024
	s.TenantAdd(t, "acme", actionbustest.TenantLimits{MaxSubscriptions: subs, MaxPayload: payload})
	asyncErrs := make(chan error, 16)
	nc := s.TenantUserConnect(t, "acme", accounts.ClientUser("acme"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		asyncErrs <- err
	}))
	// The connection's own reply subscription (new-style requests) is not
	// made yet: the subscriptions below are all it has.
	for i := 0; i < subs; i++ {
		if _, err := nc.SubscribeSync("ab.run.acme." + events.NewID() + ".*"); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.SubscribeSync("ab.run.acme." + events.NewID() + ".*"); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-asyncErrs:
		if !strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions exceeded") {
			t.Fatalf("subscription %d: %v", subs+1, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("subscription %d of acme was accepted, limit %d", subs+1, subs)
	}

	// The server enforces the account's payload limit: a connection whose
	// INFO still shows the server's own limit sends the message and is
	// closed with "maximum payload violation", nothing delivered; one
	// whose INFO shows the account's refuses to send it.
	closed := make(chan struct{})
	big := s.TenantUserConnect(t, "acme", accounts.ApproverUser("acme"), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err := big.Publish("ab.run.acme."+events.NewID()+".approve", make([]byte, payload+1)); err != nil {
		// The server told the connection the account's limit (in its
		// INFO) before the message: the client refuses it itself.
		if !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatal(err)
		}
		return
	}
	_ = big.Flush()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("a message of %d bytes was accepted, limit %d", payload+1, payload)
	}
	if err := big.LastError(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "maximum payload") {
		t.Fatalf("closed with %v, want maximum payload violation", err)
	}
}

// BenchmarkTenantAdd measures adding a tenant to a running server: keys,
// signing, creds files, the push through the system account, and the
// tenant client's first connection.
func BenchmarkTenantAdd(b *testing.B) {
	s := actionbustest.NewServer(b, actionbustest.Options{Operator: true})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		nc := s.TenantAdd(b, fmt.Sprintf("t%d", i), actionbustest.TenantLimits{})
		nc.Close()
	}
}

// A tenant at its subscription limit is refused the next subscription
// (an asynchronous error), yet its client is not stalled: a run started
// and waited on without a live subscription still ends, learned through
// the read service.
func TestATenantAtItsSubscriptionLimitStillLearnsItsRunsEnd(t *testing.T) {
	s := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	s.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		type in struct {
			Text string `json:"text"`
		}
		return executor.Register(ex, executor.Action{Name: "t.echo", Description: "Echo."},
			func(_ context.Context, x in, _ executor.Call) (executor.Result[in], error) {
				return executor.Result[in]{Output: x, Summary: x.Text}, nil
			})
	}})
	const subs = 8
	s.TenantAdd(t, "acme", actionbustest.TenantLimits{MaxSubscriptions: subs})
	refused := make(chan error, 64)
	nc := s.TenantUserConnect(t, "acme", accounts.ClientUser("acme"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case refused <- err:
		default:
		}
	}))
	c, err := client.New(nc, client.Options{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	// The client's reply subscription first, then every other one the
	// account allows.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Actions(ctx); err != nil {
		t.Fatal(err)
	}
	for range subs {
		if _, err := nc.SubscribeSync("ab.run.acme." + events.NewID() + ".*"); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-refused:
		if !strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions exceeded") {
			t.Fatalf("unexpected refusal: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("acme was allowed more subscriptions than its limit")
	}
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.echo", Args: map[string]any{"text": "hi"}}}, nil)
	if err != nil {
		t.Fatalf("acme's run at its subscription limit: %v", err)
	}
	if res.Status != client.StatusCompleted {
		t.Fatalf("acme's run ended %s: %+v", res.Status, res.Error)
	}
}

// operatorStore opens the operator store of s, started with
// Options.Operator.
func operatorStore(t testing.TB, s *actionbustest.Server) *accounts.Store {
	t.Helper()
	store, err := accounts.Open(s.OperatorDir)
	if err != nil {
		t.Fatalf("open the operator store: %v", err)
	}
	return store
}
