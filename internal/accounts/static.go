package accounts

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/jwt/v2"
)

// The static accounts.conf, rendered from the same layout as operator
// mode: for small deployments that list their tenants in the server's
// configuration (a new tenant then needs a config reload).

// PasswordVar returns the environment variable (without $) that holds
// user's password in the static config: CLIENT_ACME_PASSWORD for
// client-acme.
func PasswordVar(user string) string {
	return strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
}

// StaticTenantAccount returns the accounts.conf block of tenant's
// account: its client and approver users (passwords from
// $<USER>_PASSWORD), its imports from ACTIONBUS, JetStream disabled and
// the limits l (with defaults). ACTIONBUS's exports must list the tenant
// ([StaticServiceAccount]).
func StaticTenantAccount(prefix, tenant string, l Limits, pools ...string) string {
	l = l.WithDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "  # Tenant %s: its own account, no JetStream; what crosses is its imports.\n", tenant)
	fmt.Fprintf(&b, "  %s {\n    jetstream: disabled\n    users: [\n", tenant)
	for _, u := range TenantUsers(prefix, tenant) {
		writeStaticUser(&b, u)
	}
	b.WriteString("    ]\n    imports: [\n")
	for _, c := range Imports(prefix, tenant, pools...) {
		fmt.Fprintf(&b, "      { %s: { account: %s, subject: %s } }\n", kindWord(c.Kind), c.exporter(), strconv.Quote(c.Subject))
	}
	b.WriteString("    ]\n")
	fmt.Fprintf(&b, "    limits: { max_connections: %d, max_subscriptions: %d, max_payload: %d }\n  }\n",
		l.MaxConnections, l.MaxSubscriptions, l.MaxPayload)
	return b.String()
}

// StaticServiceAccount returns the accounts.conf block of the ACTIONBUS
// account: JetStream enabled, the service users of pools (passwords from
// $<USER>_PASSWORD), and the exports, each restricted to tenants.
func StaticServiceAccount(prefix string, tenants []string, pools ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users: [\n", ServiceAccount)
	for _, u := range ServiceUsers(pools...) {
		writeStaticUser(&b, u)
	}
	b.WriteString("    ]\n    exports: [\n")
	quoted := make([]string, len(tenants))
	copy(quoted, tenants)
	writeTenantExports(&b, prefix, ServiceAccount, quoted, pools)
	for _, e := range OwnExports(pools...) {
		fmt.Fprintf(&b, "      { %s: %s, accounts: [%s]", kindWord(e.Kind), strconv.Quote(e.Subject), strings.Join(e.Accounts, ", "))
		if e.Response != "" {
			fmt.Fprintf(&b, ", response_type: %s", strings.ToLower(string(e.Response)))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("    ]\n  }\n")
	return b.String()
}

// StaticOwnAccount returns the accounts.conf block of the account of its
// own a: its user (password from $<USER>_PASSWORD), JetStream disabled,
// and its imports from ACTIONBUS, which ACTIONBUS exports to it
// ([StaticServiceAccount]).
func StaticOwnAccount(a OwnAccount, prefix string, tenants, pools []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  # %s's account of its own: no JetStream; what crosses is its imports.\n", a.User.Name)
	fmt.Fprintf(&b, "  %s {\n    jetstream: disabled\n    users: [\n", a.Name)
	writeStaticUser(&b, a.User)
	b.WriteString("    ]\n    imports: [\n")
	for _, c := range a.Crossings {
		fmt.Fprintf(&b, "      { %s: { account: %s, subject: %s }", kindWord(c.Kind), ServiceAccount, strconv.Quote(c.Subject))
		if c.Local != "" {
			fmt.Fprintf(&b, ", to: %s", strconv.Quote(c.Local))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("    ]\n")
	var exports strings.Builder
	writeTenantExports(&exports, prefix, a.Name, tenants, pools)
	if exports.Len() > 0 {
		b.WriteString("    exports: [\n" + exports.String() + "    ]\n")
	}
	b.WriteString("  }\n")
	return b.String()
}

// writeTenantExports writes account's exports to tenants ([Exports] from
// it), each restricted to tenants.
func writeTenantExports(b *strings.Builder, prefix, account string, tenants, pools []string) {
	for _, c := range Exports(prefix, pools...) {
		if c.exporter() == account {
			fmt.Fprintf(b, "      { %s: %s, accounts: [%s] }\n", kindWord(c.Kind), strconv.Quote(c.Subject), strings.Join(tenants, ", "))
		}
	}
}

// StaticConfig returns a whole static accounts configuration: ACTIONBUS,
// the accounts of their own (planner, auditor, one per pool) and one per
// tenant.
func StaticConfig(prefix string, tenants []string, l Limits, pools ...string) string {
	var b strings.Builder
	b.WriteString("# actionbus accounts (rendered by internal/accounts: actionbus tenant users TENANT prints a tenant's block).\naccounts {\n")
	b.WriteString(StaticServiceAccount(prefix, tenants, pools...))
	for _, a := range OwnAccounts(pools...) {
		b.WriteString(StaticOwnAccount(a, prefix, tenants, pools))
	}
	for _, t := range tenants {
		b.WriteString(StaticTenantAccount(prefix, t, l, pools...))
	}
	b.WriteString("}\n")
	return b.String()
}

func writeStaticUser(b *strings.Builder, u User) {
	fmt.Fprintf(b, "      { user: %s, password: $%s", u.Name, PasswordVar(u.Name))
	if len(u.Permissions.Pub)+len(u.Permissions.Sub) > 0 {
		b.WriteString(", permissions: {\n")
		fmt.Fprintf(b, "          publish: { allow: [%s] }\n", quoteList(u.Permissions.Pub))
		fmt.Fprintf(b, "          subscribe: { allow: [%s] }\n", quoteList(u.Permissions.Sub))
		if u.Permissions.AllowResponses {
			b.WriteString("          allow_responses: true\n")
		}
		b.WriteString("      }")
	}
	b.WriteString(" }\n")
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

func kindWord(k jwt.ExportType) string {
	if k == jwt.Service {
		return "service"
	}
	return "stream"
}
