package events

import "github.com/actionbus/actionbus"

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

// ValidTenant reports whether t is a safe tenant token: 1 to 32
// characters, lower-case letters, digits, '-' and '_', starting with a
// letter or digit. The rule keeps tenants usable as subject tokens,
// key-value key tokens and NATS user names alike.
func ValidTenant(t string) bool {
	if t == "" || len(t) > maxTenantLen {
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
		Message: "tenants are 1 to 32 lower-case letters, digits, '-' or '_', starting with a letter or digit"}).
		WithDetail("tenant", clip(t, 64))
}

// TenantOr returns t, or [DefaultTenant] when t is empty.
func TenantOr(t string) string {
	if t == "" {
		return DefaultTenant
	}
	return t
}
