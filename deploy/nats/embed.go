// Package natsconf holds the deployment's static NATS configuration
// (accounts.conf: the ACTIONBUS account with the least-privilege user of
// every service, and one account per tenant; tenant-account.conf.tmpl: the
// account of one tenant) for programs and tests that start a server with
// it, such as actionbustest with Options.Users.
package natsconf

import (
	_ "embed"
	"strconv"
	"strings"
)

// shipped is accounts.conf as shipped: the services' account and the
// accounts of the tenants default, acme and globex.
//
//go:embed accounts.conf
var shipped string

//go:embed tenant-account.conf.tmpl
var tenantAccount string

// ServiceAccount is the name of the services' account.
const ServiceAccount = "ACTIONBUS"

// Users are the users of the services' account, and of the default
// tenant's account (client and approver).
var Users = []string{"admin", "dispatcher", "planner", "executor", "auditor", "client", "approver"}

// DefaultTenant is the tenant whose users are the plain "client" and
// "approver".
const DefaultTenant = "default"

// ExampleTenants are the tenants other than default whose accounts
// accounts.conf ships with.
var ExampleTenants = []string{"acme", "globex"}

// The tenant accounts of accounts.conf lie between these lines.
const (
	tenantsBegin = "  # (tenant accounts)\n"
	tenantsEnd   = "  # (end of tenant accounts)\n"
)

// ClientUser returns the name of a tenant's client user: "client" for the
// default tenant, "client-<tenant>" otherwise (user names are unique
// across a server's accounts).
func ClientUser(tenant string) string { return tenantUser("client", tenant) }

// ApproverUser returns the name of a tenant's approver user: "approver"
// for the default tenant, "approver-<tenant>" otherwise.
func ApproverUser(tenant string) string { return tenantUser("approver", tenant) }

func tenantUser(role, tenant string) string {
	if tenant == DefaultTenant {
		return role
	}
	return role + "-" + tenant
}

// PasswordVar returns the environment variable holding user's password
// (without the $): CLIENT_ACME_PASSWORD for client-acme.
func PasswordVar(user string) string {
	return strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
}

// TenantAccount returns the accounts.conf block of a tenant's account
// (its client and approver users, its imports and limits), to paste into
// the accounts of accounts.conf (`actionbus tenant users <tenant>` prints
// it). The tenant must be a valid tenant name (events.CheckTenant).
func TenantAccount(tenant string) string {
	client, approver := ClientUser(tenant), ApproverUser(tenant)
	return strings.NewReplacer(
		"{{TENANT}}", tenant,
		"{{CLIENT}}", client, "{{CLIENT_ENV}}", strings.TrimSuffix(PasswordVar(client), "_PASSWORD"),
		"{{APPROVER}}", approver, "{{APPROVER_ENV}}", strings.TrimSuffix(PasswordVar(approver), "_PASSWORD"),
	).Replace(tenantAccount)
}

// WithTenants returns accounts.conf with the accounts of the default
// tenant and of tenants in place of the shipped tenant accounts.
func WithTenants(tenants ...string) string {
	var b strings.Builder
	seen := map[string]bool{}
	for _, t := range append([]string{DefaultTenant}, tenants...) {
		if seen[t] {
			continue
		}
		seen[t] = true
		b.WriteString("\n")
		b.WriteString(TenantAccount(t))
	}
	i, j := strings.Index(shipped, tenantsBegin), strings.Index(shipped, tenantsEnd)
	return shipped[:i+len(tenantsBegin)] + b.String() + shipped[j:]
}

// Accounts is accounts.conf as shipped.
var Accounts = shipped

// WithPasswords returns conf (Accounts, or [WithTenants]'s) with the
// password variable of every user named in users replaced by
// password(user), quoted, so that no environment is needed.
func WithPasswords(conf string, users []string, password func(user string) string) string {
	for _, u := range users {
		conf = strings.ReplaceAll(conf, "$"+PasswordVar(u), strconv.Quote(password(u)))
	}
	return conf
}

// TenantUserNames returns the client and approver user names of tenants
// other than the default (whose users are in Users).
func TenantUserNames(tenants ...string) []string {
	var out []string
	for _, t := range tenants {
		if t != DefaultTenant {
			out = append(out, ClientUser(t), ApproverUser(t))
		}
	}
	return out
}
