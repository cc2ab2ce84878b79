package events

import (
	"strings"

	"github.com/actionbus/actionbus"
)

// DefaultTenant is the tenant of a run that names none: a single-team
// deployment never has to know tenants exist.
const DefaultTenant = "default"

// ExtTenant is the CloudEvent extension attribute carrying a run's tenant.
// On per-run subjects it must equal the subject's tenant token; on pool
// work subjects (which carry no tenant) it is the only place the tenant
// travels, and only the dispatcher may publish there.
const ExtTenant = "tenant"

// maxTenantLen bounds a tenant token.
const maxTenantLen = 32

// ReservedTenants are the names no tenant may take: the service
// account and the services (whose inbox prefixes _INBOX_<service> a
// tenant named after one would share), the NATS system account, and
// words an operator reads as "everyone". A tenant is a NATS account
// named after it (operator mode) and its users are named after it
// (static config), so these names would collide with, or be mistaken
// for, what the services own.
var ReservedTenants = []string{
	"actionbus", "sys", "system", "admin", "dispatcher", "planner", "executor",
	"auditor", "global", "services", "service", "operator", "console", "client",
	"approver", "all", "any", "root", "nats", "jetstream", "js", "inbox",
}

// reservedTenant is ReservedTenants as a set.
var reservedTenant = func() map[string]bool {
	m := make(map[string]bool, len(ReservedTenants))
	for _, r := range ReservedTenants {
		m[r] = true
	}
	return m
}()

// servicePrefixed are the reserved names that services extend with
// "-<something>" (executor-<pool> users and inboxes, for one): a tenant
// may not start with one of them followed by '-' or '_' either.
var servicePrefixed = map[string]bool{
	"actionbus": true, "sys": true, "system": true, "admin": true, "dispatcher": true,
	"planner": true, "executor": true, "auditor": true, "operator": true,
}

// ValidTenant reports whether t is a safe tenant token: 1 to 32
// characters, lower-case letters, digits, '-' and '_', starting with a
// letter or digit, and none of [ReservedTenants] (nor one of them
// followed by '-' or '_' and more, such as "executor-billing": a pool's
// executor user and inbox are named that way). The rule keeps tenants
// usable as subject tokens, key-value key tokens, NATS account names and
// NATS user names alike.
func ValidTenant(t string) bool {
	if t == "" || len(t) > maxTenantLen {
		return false
	}
	if reservedTenant[t] {
		return false
	}
	if i := strings.IndexAny(t, "-_"); i > 0 && servicePrefixed[t[:i]] {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '_') && i > 0:
		default:
			return false
		}
	}
	return true
}

// CheckTenant returns a typed invalid_tenant error when t is not a
// [ValidTenant].
func CheckTenant(t string) error {
	if ValidTenant(t) {
		return nil
	}
	return (&actionbus.Error{Code: actionbus.CodeInvalidTenant,
		Message: "tenants are 1 to 32 lower-case letters, digits, '-' or '_', starting with a letter or digit, and not a reserved name (" + strings.Join(ReservedTenants, ", ") + ")"}).
		WithDetail("tenant", clip(t, 64))
}

// TenantOr returns t, or [DefaultTenant] when t is empty.
func TenantOr(t string) string {
	if t == "" {
		return DefaultTenant
	}
	return t
}
