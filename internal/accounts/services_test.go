package accounts_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/internal/accounts"
)

// The service users' permissions of operator mode (one Go table) are the
// static deploy/nats/accounts.conf's, as the server reads that file: a
// grant changed in one and not the other fails here.
func TestServiceUsersMatchTheStaticConfig(t *testing.T) {
	conf := natsconf.WithPasswords(natsconf.Accounts, append(natsconf.Users, natsconf.TenantUserNames(natsconf.ExampleTenants...)...), func(u string) string { return "pw-" + u })
	path := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	static := map[string]*server.Permissions{}
	account := map[string]string{}
	for _, u := range opts.Users {
		static[u.Username] = u.Permissions
		account[u.Username] = u.Account.Name
	}
	for _, u := range accounts.AllServiceUsers() {
		if got, want := account[u.Name], accounts.AccountOf(u.Name); got != want {
			t.Errorf("%s is a user of %s in accounts.conf, of %s in the layout", u.Name, got, want)
		}
		sp, ok := static[u.Name]
		if !ok {
			t.Errorf("accounts.conf has no user %s", u.Name)
			continue
		}
		if u.Name == "admin" {
			if sp != nil || len(u.Permissions.Pub)+len(u.Permissions.Sub) != 0 {
				t.Error("admin is restricted in one and not the other")
			}
			continue
		}
		if sp == nil || sp.Publish == nil || sp.Subscribe == nil {
			t.Errorf("%s: no permissions in accounts.conf", u.Name)
			continue
		}
		if len(sp.Publish.Deny) > 0 || len(sp.Subscribe.Deny) > 0 {
			t.Errorf("%s: accounts.conf denies subjects; the Go table has allow lists only", u.Name)
		}
		if !sameSet(u.Permissions.Pub, sp.Publish.Allow) {
			t.Errorf("%s publish differs:\n go:   %v\n conf: %v", u.Name, u.Permissions.Pub, sp.Publish.Allow)
		}
		if !sameSet(u.Permissions.Sub, sp.Subscribe.Allow) {
			t.Errorf("%s subscribe differs:\n go:   %v\n conf: %v", u.Name, u.Permissions.Sub, sp.Subscribe.Allow)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
