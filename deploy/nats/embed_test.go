package natsconf_test

import (
	"strings"
	"testing"

	natsconf "github.com/actionbus/actionbus/deploy/nats"
)

// The shipped client and approver users are the tenant template rendered
// for the default tenant: adding a tenant gives exactly what the default
// tenant has, for its own subjects.
func TestTheDefaultTenantsUsersAreTheTemplates(t *testing.T) {
	if !strings.Contains(natsconf.Accounts, natsconf.TenantUsers(natsconf.DefaultTenant)) {
		t.Fatal("accounts.conf's client and approver differ from tenant-users.conf.tmpl rendered for \"default\"; paste `actionbus tenant users default` into it")
	}
}

func TestATenantsUsersNameOnlyItsSubjects(t *testing.T) {
	users := natsconf.TenantUsers("acme")
	for _, want := range []string{"user: client-acme", "user: approver-acme", "$CLIENT_ACME_PASSWORD", "$APPROVER_ACME_PASSWORD",
		`"ab.run.acme.*.requested"`, `"_INBOX_acme.>"`, `"$JS.API.CONSUMER.CREATE.AB_RUNS.*.ab.run.acme.>"`} {
		if !strings.Contains(users, want) {
			t.Errorf("tenant users lack %s", want)
		}
	}
	for _, leak := range []string{"default", "ab.run.*", "_INBOX.>", "STREAM.MSG.GET.AB_"} {
		if strings.Contains(users, leak) {
			t.Errorf("tenant users mention %s", leak)
		}
	}
	conf := natsconf.WithTenants("acme", "globex")
	if !strings.Contains(conf, "user: client-globex") || strings.Count(conf, "user: client-acme") != 1 {
		t.Error("WithTenants adds each tenant's users once")
	}
}
