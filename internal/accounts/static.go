package accounts

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/actionbus/actionbus/internal/bus"
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
func StaticTenantAccount(prefix, tenant string, l Limits) string {
	l = l.WithDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "  # Tenant %s: its own account, no JetStream; what crosses is its imports.\n", tenant)
	fmt.Fprintf(&b, "  %s {\n    jetstream: disabled\n    users: [\n", tenant)
	for _, u := range TenantUsers(prefix, tenant) {
		writeStaticUser(&b, u)
	}
	b.WriteString("    ]\n    imports: [\n")
	for _, c := range Imports(prefix, tenant) {
		fmt.Fprintf(&b, "      { %s: { account: %s, subject: %s } }\n", kindWord(c.Kind), ServiceAccount, strconv.Quote(c.Subject))
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
	for _, c := range Exports(prefix) {
		fmt.Fprintf(&b, "      { %s: %s, accounts: [%s] }\n", kindWord(c.Kind), strconv.Quote(c.Subject), strings.Join(quoted, ", "))
	}
	for _, e := range PoolExports(pools...) {
		names := make([]string, len(e.Pools))
		for i, p := range e.Pools {
			names[i] = PoolAccount(p)
		}
		fmt.Fprintf(&b, "      { %s: %s, accounts: [%s]", kindWord(e.Kind), strconv.Quote(e.Subject), strings.Join(names, ", "))
		if e.Response != "" {
			fmt.Fprintf(&b, ", response_type: %s", strings.ToLower(string(e.Response)))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("    ]\n  }\n")
	return b.String()
}

// StaticPoolAccount returns the accounts.conf block of pool's executors'
// account ([PoolAccount]): its executor user (password from
// $<USER>_PASSWORD), JetStream disabled, and its imports from ACTIONBUS
// ([PoolCrossings]), which ACTIONBUS exports to it
// ([StaticServiceAccount]).
func StaticPoolAccount(pool string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  # Pool %s's executors: their own account, no JetStream; what crosses is its imports.\n", pool)
	fmt.Fprintf(&b, "  %s {\n    jetstream: disabled\n    users: [\n", PoolAccount(pool))
	for _, u := range ExecutorUsers(pool) {
		writeStaticUser(&b, u)
	}
	b.WriteString("    ]\n    imports: [\n")
	for _, c := range PoolCrossings(pool) {
		fmt.Fprintf(&b, "      { %s: { account: %s, subject: %s }", kindWord(c.Kind), ServiceAccount, strconv.Quote(c.Subject))
		if c.Local != "" {
			fmt.Fprintf(&b, ", to: %s", strconv.Quote(c.Local))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("    ]\n  }\n")
	return b.String()
}

// StaticConfig returns a whole static accounts configuration: ACTIONBUS,
// one account per pool and one per tenant.
func StaticConfig(prefix string, tenants []string, l Limits, pools ...string) string {
	var b strings.Builder
	b.WriteString("# actionbus accounts (rendered by internal/accounts: actionbus tenant users TENANT prints a tenant's block).\naccounts {\n")
	b.WriteString(StaticServiceAccount(prefix, tenants, pools...))
	if len(pools) == 0 {
		pools = []string{bus.DefaultPool}
	}
	for _, p := range pools {
		b.WriteString(StaticPoolAccount(p))
	}
	for _, t := range tenants {
		b.WriteString(StaticTenantAccount(prefix, t, l))
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
