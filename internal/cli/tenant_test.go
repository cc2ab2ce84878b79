package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/cli"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/events"
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
