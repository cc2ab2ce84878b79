package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/cli"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/ingress"
)

func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Execute(context.Background(), args, nil, &out, &errOut)
	return out.String(), errOut.String(), code
}

// `actionbus nats init` writes an operator store a server starts from;
// `actionbus tenant add` adds a tenant to that running server (no
// restart) whose client creds then start a run request through its
// import; a reserved name is refused; `tenant remove` closes the
// tenant's connection.
func TestTenantAddAndRemoveOnARunningServer(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "op")
	if out, errOut, code := runCLI(t, "nats", "init", "--dir", dir); code != 0 {
		t.Fatalf("nats init: %d %s %s", code, out, errOut)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("store mode %v %v", fi.Mode(), err)
	}
	for _, f := range []string{"operator.nk", "accounts/ACTIONBUS/account.nk", "accounts/ACTIONBUS/users/dispatcher.creds", "server.conf"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v %v", f, fi.Mode(), err)
		}
	}
	if _, _, code := runCLI(t, "nats", "init", "--dir", dir); code == 0 {
		t.Fatal("nats init overwrote an operator store")
	}
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), OperatorDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	url := ns.ClientURL()
	admin, err := nats.Connect(url, nats.UserCredentials(filepath.Join(dir, "accounts/ACTIONBUS/users/admin.creds")))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if out, errOut, code := runCLI(t, "--nats", url, "--creds", filepath.Join(dir, "accounts/ACTIONBUS/users/admin.creds"), "provision"); code != 0 {
		t.Fatalf("provision: %s %s", out, errOut)
	}
	// The ingress (a dispatcher's) answers tenants' requests, as the
	// dispatcher user.
	dispatcher, err := nats.Connect(url, nats.UserCredentials(filepath.Join(dir, "accounts/ACTIONBUS/users/dispatcher.creds")),
		nats.CustomInboxPrefix("_INBOX_dispatcher"))
	if err != nil {
		t.Fatal(err)
	}
	defer dispatcher.Close()
	in, err := ingress.New(dispatcher, ingress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(); err != nil {
		t.Fatal(err)
	}
	defer in.Stop()

	if _, errOut, code := runCLI(t, "--nats", url, "tenant", "add", "auditor", "--dir", dir); code == 0 || !strings.Contains(errOut, "reserved") {
		t.Fatalf("tenant add auditor: %d %s", code, errOut)
	}
	out, errOut, code := runCLI(t, "--nats", url, "tenant", "add", "acme", "--dir", dir, "--max-connections", "4")
	if code != 0 {
		t.Fatalf("tenant add: %s %s", out, errOut)
	}
	credsDir := filepath.Join(dir, "accounts", "acme", "users")
	if !strings.Contains(out, credsDir) {
		t.Fatalf("tenant add printed %q, not the creds directory", out)
	}
	closed := make(chan struct{})
	acme, err := nats.Connect(url, nats.UserCredentials(filepath.Join(credsDir, accounts.ClientUser("acme")+".creds")),
		nats.CustomInboxPrefix("_INBOX_acme"), nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("acme's client: %v", err)
	}
	defer acme.Close()
	if _, err := acme.Request("ab.run.acme."+events.NewID()+".requested", []byte(`{}`), 5*time.Second); err != nil {
		t.Fatalf("acme's request got no ack: %v", err)
	}
	if out, _, _ := runCLI(t, "tenant", "list", "--dir", dir); strings.TrimSpace(out) != "acme" {
		t.Fatalf("tenant list: %q", out)
	}

	if out, errOut, code := runCLI(t, "--nats", url, "tenant", "remove", "acme", "--dir", dir); code != 0 {
		t.Fatalf("tenant remove: %s %s", out, errOut)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("acme's connection stayed open after tenant remove")
	}
}

// `actionbus tenant users` prints the tenant's static account block.
func TestTenantUsersPrintsTheStaticAccountBlock(t *testing.T) {
	out, _, code := runCLI(t, "tenant", "users", "acme")
	if code != 0 || out != accounts.StaticTenantAccount("ab", "acme", accounts.Limits{}) {
		t.Fatalf("tenant users acme: %d\n%s", code, out)
	}
	if _, errOut, code := runCLI(t, "tenant", "users", "dispatcher"); code == 0 || !strings.Contains(errOut, "invalid_tenant") && !strings.Contains(errOut, "reserved") {
		t.Fatalf("tenant users dispatcher: %d %s", code, errOut)
	}
}

var tenantCredsPattern = regexp.MustCompile(`tenant default: client creds (\S+),`)

// `actionbus dev` runs in operator mode: a connection without creds is
// refused, and the default tenant (an account added at start) starts a
// run with its client creds and receives the run's events live through
// its imports, served by services connected as their own users.
func TestDevRunsInOperatorModeWithTheDefaultTenant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	devCtx, stopDev := context.WithCancel(ctx)
	defer stopDev()
	var devOut syncWriter
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(devCtx, []string{"dev", "--port", "-1", "--store", t.TempDir(), "--no-demo", "--console", "off", "--latency", "0s"}, nil, &devOut, &devOut)
	}()
	url := waitForURL(t, &devOut)
	m := tenantCredsPattern.FindStringSubmatch(devOut.String())
	if m == nil {
		t.Fatalf("dev printed no tenant creds:\n%s", devOut.String())
	}
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("dev accepted a connection without creds")
	}
	nc, err := nats.Connect(url, nats.UserCredentials(m[1]), nats.CustomInboxPrefix(client.InboxPrefix(events.DefaultTenant)))
	if err != nil {
		t.Fatalf("the default tenant's client: %v", err)
	}
	defer nc.Close()
	run := events.NewID()
	live, err := nc.SubscribeSync("ab.run.default." + run + ".*")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(nc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, client.RunRequest{RunID: run, Action: &client.ActionCall{Name: "delivery.searchJobs", Args: map[string]any{"status": []string{"FAILED"}}}}); err != nil {
		t.Fatalf("start: %v", err)
	}
	for {
		msg, err := live.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("the run did not end live: %v", err)
		}
		if strings.HasSuffix(msg.Subject, ".failed") {
			t.Fatalf("the run failed: %s", msg.Data)
		}
		if strings.HasSuffix(msg.Subject, ".completed") {
			break
		}
	}
	stopDev()
	if code := <-done; code != 0 {
		t.Fatalf("dev exited %d:\n%s", code, devOut.String())
	}
}

// `actionbus dev --no-operator` still runs the demo on a server without
// accounts.
func TestDevWithoutOperatorModeRunsTheDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"dev", "--no-operator", "--port", "-1", "--store", t.TempDir(), "--exit-after-demo", "--console", "off", "--latency", "0s"}, nil, &out, &errOut)
	if code != 0 || strings.Contains(out.String(), "operator mode") || !strings.Contains(out.String(), "✔ completed") {
		t.Fatalf("exit %d:\n%s\n%s", code, out.String(), errOut.String())
	}
}
