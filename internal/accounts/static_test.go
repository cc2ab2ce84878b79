package accounts_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/embedded"
)

// The static accounts.conf rendered from the layout is a valid server
// configuration with the same crossings as operator mode: acme's client
// gets the ACTIONBUS stream's ack for its request, receives its run's
// events, and its account has no JetStream.
func TestStaticConfigRenderedFromTheLayoutCrosses(t *testing.T) {
	tenants := []string{events.DefaultTenant, "acme"}
	conf := accounts.StaticConfig("ab", tenants, accounts.Limits{})
	var users []string
	for _, u := range accounts.AllServiceUsers() {
		users = append(users, u.Name)
	}
	for _, tn := range tenants {
		for _, u := range accounts.TenantUsers("ab", tn) {
			users = append(users, u.Name)
		}
	}
	for _, u := range users {
		conf = strings.ReplaceAll(conf, "$"+accounts.PasswordVar(u), strconv.Quote("pw-"+u))
	}
	if strings.Contains(conf, "$") && strings.Contains(conf, "_PASSWORD") {
		t.Fatal("a password variable is left")
	}
	path := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), ConfigFile: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	connect := func(user, inbox string) *nats.Conn {
		u, _ := url.Parse(ns.ClientURL())
		u.User = url.UserPassword(user, "pw-"+user)
		nc, err := nats.Connect(u.String(), nats.CustomInboxPrefix(accounts.InboxPrefix(inbox)))
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	admin := connect("admin", "admin")
	js, _ := jetstream.New(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topo := bus.Topology{Prefix: "ab"}
	if err := topo.Provision(ctx, js); err != nil {
		t.Fatal(err)
	}
	serveIngress(t, connect("dispatcher", "dispatcher"))
	acme := connect("client-acme", "acme")
	live, err := acme.SubscribeSync("ab.run.acme.*.started")
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.Flush(); err != nil {
		t.Fatal(err)
	}
	run := events.NewID()
	reply, err := acme.Request("ab.run.acme."+run+".requested", []byte(`{}`), 5*time.Second)
	if err != nil {
		t.Fatalf("no ack: %v", err)
	}
	var ack pubAck
	if err := json.Unmarshal(reply.Data, &ack); err != nil || ack.Stream != topo.StreamRequests() {
		t.Fatalf("ack %s", reply.Data)
	}
	if err := connect("dispatcher", "dispatcher").Publish("ab.run.acme."+run+".started", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := live.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("acme did not receive its run's event: %v", err)
	}
	if _, err := acme.Request("ab.run.default."+run+".requested", []byte(`{}`), time.Second); err == nil {
		t.Fatal("acme's client published a request of the default tenant")
	}
}
