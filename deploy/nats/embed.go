// Package natsconf holds the deployment's NATS configuration
// (accounts.conf: the ACTIONBUS account and the least-privilege user of
// every service, client and approver; tenant-users.conf.tmpl: the client
// and approver users of one tenant) for programs and tests that start a
// server with it, such as actionbustest with Options.Users.
package natsconf

import (
	_ "embed"
	"strconv"
	"strings"
)

// Accounts is accounts.conf as shipped. Each user's password is the
// environment variable <USER>_PASSWORD, which nats-server resolves when it
// reads the file.
//
//go:embed accounts.conf
var Accounts string

//go:embed tenant-users.conf.tmpl
var tenantUsers string

// Users are the users Accounts defines.
var Users = []string{"admin", "dispatcher", "planner", "executor", "auditor", "client", "approver"}

// DefaultTenant is the tenant whose users are the plain "client" and
// "approver" of Accounts.
const DefaultTenant = "default"

// tenantUsersMark is the line of Accounts after which tenants' users go.
const tenantUsersMark = "      # (tenant users)\n"

// ClientUser returns the name of a tenant's client user: "client" for the
// default tenant, "client-<tenant>" otherwise.
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

// TenantUsers returns the accounts.conf entries of a tenant's client and
// approver users, to paste into the users list of the ACTIONBUS account
// (`actionbus tenant users <tenant>` prints them). The tenant must be a
// valid tenant token (1 to 32 of a-z, 0-9, '-', '_').
func TenantUsers(tenant string) string {
	client, approver := ClientUser(tenant), ApproverUser(tenant)
	return strings.NewReplacer(
		"{{TENANT}}", tenant,
		"{{CLIENT}}", client, "{{CLIENT_ENV}}", strings.TrimSuffix(PasswordVar(client), "_PASSWORD"),
		"{{APPROVER}}", approver, "{{APPROVER_ENV}}", strings.TrimSuffix(PasswordVar(approver), "_PASSWORD"),
	).Replace(tenantUsers)
}

// WithTenants returns Accounts with the users of tenants added.
func WithTenants(tenants ...string) string {
	var b strings.Builder
	for _, t := range tenants {
		if t == DefaultTenant {
			continue
		}
		b.WriteString("\n")
		b.WriteString(TenantUsers(t))
	}
	return strings.Replace(Accounts, tenantUsersMark, tenantUsersMark+b.String(), 1)
}

// WithPasswords returns conf (Accounts, or [WithTenants]'s) with the
// password variable of every user named in users replaced by
// password(user), quoted, so that no environment is needed.
func WithPasswords(conf string, users []string, password func(user string) string) string {
	for _, u := range users {
		conf = strings.ReplaceAll(conf, "$"+PasswordVar(u), strconv.Quote(password(u)))
	}
	return conf
}

// TenantUserNames returns the client and approver user names of tenants.
func TenantUserNames(tenants ...string) []string {
	var out []string
	for _, t := range tenants {
		if t != DefaultTenant {
			out = append(out, ClientUser(t), ApproverUser(t))
		}
	}
	return out
}
