package natsconf_test

import (
	"strings"
	"testing"

	natsconf "github.com/actionbus/actionbus/deploy/nats"
)

// accounts.conf is the layout of internal/accounts rendered for the
// tenants it ships with: adding a tenant gives exactly what the shipped
// ones have, for its own subjects.
func TestTheShippedAccountsAreTheLayoutRendered(t *testing.T) {
	if got := natsconf.WithTenants(natsconf.ExampleTenants...); got != natsconf.Accounts {
		t.Fatal("deploy/nats/accounts.conf differs from internal/accounts' layout rendered for default, acme and globex; regenerate it: go run ./deploy/nats/gen > deploy/nats/accounts.conf")
	}
}

func TestWithTenantsAddsEachTenantsAccountOnce(t *testing.T) {
	conf := natsconf.WithTenants("acme", "globex", "acme")
	if !strings.Contains(conf, "user: client-globex") || strings.Count(conf, "user: client-acme") != 1 || strings.Count(conf, "\n  default {") != 1 {
		t.Error("WithTenants adds each tenant's account once, and the default tenant's always")
	}
}
