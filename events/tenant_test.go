package events_test

import (
	"testing"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// A tenant named after a service, the service account, the system
// account or a word meaning "everyone" is refused with invalid_tenant:
// its account, users and inbox prefix would collide with the services'.
func TestReservedTenantNamesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		tenant string
		ok     bool
	}{
		{"default", true},
		{"acme", true},
		{"globex-eu", true},
		{"all-stars", true},
		{"executors", true},
		{"actionbus", false},
		{"sys", false},
		{"system", false},
		{"admin", false},
		{"dispatcher", false},
		{"planner", false},
		{"executor", false},
		{"auditor", false},
		{"global", false},
		{"services", false},
		{"operator", false},
		{"executor-billing", false},
		{"auditor_x", false},
		{"sys-1", false},
		{"Acme", false},
		{"", false},
	} {
		if got := events.ValidTenant(tc.tenant); got != tc.ok {
			t.Errorf("ValidTenant(%q) = %v, want %v", tc.tenant, got, tc.ok)
		}
		err := events.CheckTenant(tc.tenant)
		if (err == nil) != tc.ok {
			t.Errorf("CheckTenant(%q) = %v", tc.tenant, err)
		}
		if err != nil && actionbus.CodeOf(err) != actionbus.CodeInvalidTenant {
			t.Errorf("CheckTenant(%q): code %s, want invalid_tenant", tc.tenant, actionbus.CodeOf(err))
		}
	}
	for _, r := range events.ReservedTenants {
		if events.ValidTenant(r) {
			t.Errorf("reserved %q accepted", r)
		}
	}
}
