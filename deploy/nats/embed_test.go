package natsconf_test

import (
	"strings"
	"testing"

	natsconf "github.com/actionbus/actionbus/deploy/nats"
)

// accounts.conf is the template rendered for the tenants it ships with:
// adding a tenant gives exactly what the shipped ones have, for its own
// subjects.
func TestTheShippedTenantAccountsAreTheTemplate(t *testing.T) {
	if got := natsconf.WithTenants(natsconf.ExampleTenants...); got != natsconf.Accounts {
		t.Fatal("accounts.conf's tenant accounts differ from tenant-account.conf.tmpl rendered for default, acme and globex; regenerate them (`actionbus tenant users <tenant>` prints one)")
	}
}

func TestATenantAccountImportsOnlyItsSubjects(t *testing.T) {
	acct := natsconf.TenantAccount("acme")
	for _, want := range []string{"acme {", "user: client-acme", "user: approver-acme", "$CLIENT_ACME_PASSWORD", "$APPROVER_ACME_PASSWORD",
		`subject: "ab.run.acme.*.requested"`, `subject: "ab.api.acme.>"`, `stream: { account: ACTIONBUS, subject: "ab.run.acme.*.*" }`} {
		if !strings.Contains(acct, want) {
			t.Errorf("tenant account lacks %s", want)
		}
	}
	for _, leak := range []string{"default", "ab.run.*", "$JS.", "jetstream", "ab.run.acme.>"} {
		if strings.Contains(acct, leak) {
			t.Errorf("tenant account mentions %s", leak)
		}
	}
	conf := natsconf.WithTenants("acme", "globex", "acme")
	if !strings.Contains(conf, "user: client-globex") || strings.Count(conf, "user: client-acme") != 1 || strings.Count(conf, "\n  default {") != 1 {
		t.Error("WithTenants adds each tenant's account once, and the default tenant's always")
	}
}
