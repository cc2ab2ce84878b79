// Package accounts is the NATS account layout of actionbus in Go, the one
// source of truth for both deployments: operator mode (JWTs signed here,
// pushed to the server's full account resolver, so that adding a tenant
// needs no restart) and the static accounts.conf (rendered from the same
// lists).
//
// The layout (docs/tenants.md): the services live in the ACTIONBUS
// account, which holds every stream, bucket and object store; each tenant
// is an account of its own, named after the tenant, with JetStream
// disabled. What crosses is an explicit export of ACTIONBUS imported by
// the tenant with the tenant token filled in (identity mapping: a subject
// means the same in both accounts), so a subject naming another tenant
// reaches nothing.
package accounts

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// ServiceAccount is the name of the services' account.
const ServiceAccount = "ACTIONBUS"

// SystemAccount is the name of the NATS system account in operator mode.
const SystemAccount = "SYS"

// SystemUser is the system account's user that pushes account JWTs.
const SystemUser = "sys"

// Crossing is one subject that crosses from ACTIONBUS to tenants: a
// service (tenant → services: requests whose replies, such as JetStream
// publish acks, come back) or a stream (services → tenant: events
// delivered to the tenant's subscribers).
type Crossing struct {
	// Kind is jwt.Service or jwt.Stream.
	Kind jwt.ExportType
	// Subject has "*" in the tenant position when exported, the tenant
	// when imported.
	Subject string
	// Local is the subject the importer knows it by, when another
	// ([PoolCrossings]: the hub domain's name of a JetStream API subject).
	Local string
	// Response is a service's response type: "" (a single answer) or
	// jwt.ResponseTypeStream (a pull request's messages).
	Response jwt.ResponseType
	// From is the exporting account: "" for ACTIONBUS, or the account of
	// its own whose user publishes the subject (a tenant imports the
	// planner's answer tokens from PLANNER and the audit records from
	// AUDITOR: nats-server never re-exports to a stream import what
	// reached ACTIONBUS through a service import).
	From string
}

// The accounts of their own of the planner and the auditor.
const (
	PlannerAccount = "PLANNER"
	AuditorAccount = "AUDITOR"
)

// exporter returns the account c is exported by.
func (c Crossing) exporter() string {
	if c.From == "" {
		return ServiceAccount
	}
	return c.From
}

// crossings are the subjects that cross, with %[1]s the prefix and %[2]s
// the tenant token. Run events have 5 tokens (ab.run.T.R.verb): timers
// (ab.run.T.R.sched.K, 6 tokens) never leave ACTIONBUS.
var crossings = []struct {
	kind   jwt.ExportType
	format string
	from   string
}{
	{jwt.Service, "%[1]s.run.%[2]s.*.requested", ""},
	{jwt.Service, "%[1]s.run.%[2]s.*.cancel", ""},
	{jwt.Service, "%[1]s.run.%[2]s.*.input", ""},
	{jwt.Service, "%[1]s.run.%[2]s.*.approve", ""},
	{jwt.Service, "%[1]s.run.%[2]s.*.deny", ""},
	{jwt.Service, "%[1]s.api.%[2]s.>", ""},
	{jwt.Stream, "%[1]s.run.%[2]s.*.*", ""},
	{jwt.Stream, "%[1]s.stream.%[2]s.*", PlannerAccount},
	{jwt.Stream, "%[1]s.run.%[2]s.*.decision", PlannerAccount},
	{jwt.Stream, "%[1]s.run.%[2]s.*.synthesized", PlannerAccount},
	{jwt.Stream, "%[1]s.audit.%[2]s.*.*", AuditorAccount},
	{jwt.Stream, "%[1]s.run.%[2]s.*.result", eachPool},
}

// eachPool marks a crossing exported by every pool's account.
const eachPool = "{pool}"

// Exports returns what crosses to tenants, the tenant position a
// wildcard: what ACTIONBUS exports, what PLANNER and AUDITOR do, and each
// of pools' accounts (default ["default"]: [Crossing.From]).
func Exports(prefix string, pools ...string) []Crossing { return render(prefix, "*", pools) }

// Imports returns what tenant's account imports: exactly [Exports] with
// the tenant position replaced by tenant.
func Imports(prefix, tenant string, pools ...string) []Crossing { return render(prefix, tenant, pools) }

func render(prefix, tenant string, pools []string) []Crossing {
	if len(pools) == 0 {
		pools = []string{bus.DefaultPool}
	}
	var out []Crossing
	for _, c := range crossings {
		subject := fmt.Sprintf(c.format, prefixOr(prefix), tenant)
		if c.from != eachPool {
			out = append(out, Crossing{Kind: c.kind, Subject: subject, From: c.from})
			continue
		}
		for _, pool := range pools {
			out = append(out, Crossing{Kind: c.kind, Subject: subject, From: PoolAccount(pool)})
		}
	}
	return out
}

func prefixOr(p string) string {
	if p == "" {
		return events.DefaultPrefix
	}
	return p
}

// Limits bound what one tenant account may hold at once. JetStream is
// always disabled in a tenant account: it has no streams, consumers or
// storage to bound.
type Limits struct {
	// MaxConnections is the most connections of the account's users at
	// once; default 64. The next one is refused by the server
	// ("maximum account active connections exceeded").
	MaxConnections int64
	// MaxSubscriptions is the most subscriptions across the account's
	// connections; default 10 000 (an HTTP API following runs holds a few per followed run).
	MaxSubscriptions int64
	// MaxPayload is the largest message a tenant user may publish;
	// default 1 MiB (1048576), the server's own default.
	MaxPayload int64
}

// Default limits of a tenant account (see [Limits]).
const (
	DefaultMaxConnections   = 64
	DefaultMaxSubscriptions = 10000
	DefaultMaxPayload       = 1 << 20
)

// Validate refuses a negative limit (which the server reads as "no
// limit").
func (l Limits) Validate() error {
	if l.MaxConnections < 0 || l.MaxSubscriptions < 0 || l.MaxPayload < 0 {
		return fmt.Errorf("accounts: limits must not be negative (connections %d, subscriptions %d, payload %d)", l.MaxConnections, l.MaxSubscriptions, l.MaxPayload)
	}
	return nil
}

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxSubscriptions == 0 {
		l.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if l.MaxPayload == 0 {
		l.MaxPayload = DefaultMaxPayload
	}
	return l
}

// Permissions are a user's publish and subscribe allow lists (nothing
// else is allowed). Empty lists on both sides mean no restriction: only
// admin has that.
type Permissions struct {
	Pub []string
	Sub []string
	// AllowResponses lets the user publish one reply to the reply subject
	// of each request it receives (services that answer requests).
	AllowResponses bool
}

// InboxPrefix is the reply inbox prefix of a tenant's or a service's
// connections: _INBOX_<name>.
func InboxPrefix(name string) string { return "_INBOX_" + name }

// ClientUser returns a tenant's client user name: "client" for the
// default tenant, "client-<tenant>" otherwise (static config user names
// are server-unique; operator mode uses the same names).
func ClientUser(tenant string) string { return tenantUser("client", tenant) }

// ApproverUser returns a tenant's approver user name: "approver" for the
// default tenant, "approver-<tenant>" otherwise.
func ApproverUser(tenant string) string { return tenantUser("approver", tenant) }

func tenantUser(role, tenant string) string {
	if tenant == events.DefaultTenant {
		return role
	}
	return role + "-" + tenant
}

// ClientPermissions are a tenant's client user's, inside the tenant's
// own account: publish its run requests, cancels and inputs and call the
// read service; receive its runs' events, answer tokens, audit records
// and replies.
func ClientPermissions(prefix, tenant string) Permissions {
	p := prefixOr(prefix)
	return Permissions{
		Pub: []string{
			p + ".run." + tenant + ".*.requested", p + ".run." + tenant + ".*.cancel", p + ".run." + tenant + ".*.input",
			p + ".api." + tenant + ".>",
		},
		Sub: []string{p + ".run." + tenant + ".*.*", p + ".stream." + tenant + ".*", p + ".audit." + tenant + ".>", InboxPrefix(tenant) + ".>"},
	}
}

// ApproverPermissions are a tenant's approver user's: publish grants and
// denials, read approvals (the read service's approvals operation, not
// the tenant's runs), receive its runs' approval requests and replies.
func ApproverPermissions(prefix, tenant string) Permissions {
	p := prefixOr(prefix)
	return Permissions{
		Pub: []string{p + ".run." + tenant + ".*.approve", p + ".run." + tenant + ".*.deny", p + ".api." + tenant + ".approvals"},
		Sub: []string{p + ".run." + tenant + ".*.approval", InboxPrefix(tenant) + ".>"},
	}
}

// TenantUsers returns the users of tenant's account, client first.
func TenantUsers(prefix, tenant string) []User {
	return []User{
		{Name: ClientUser(tenant), Permissions: ClientPermissions(prefix, tenant)},
		{Name: ApproverUser(tenant), Permissions: ApproverPermissions(prefix, tenant)},
	}
}

// User is a named user with its permissions.
type User struct {
	Name        string
	Permissions Permissions
}

// ExecutorUser returns the name of pool's executor user: "executor" for
// the default pool, "executor-<pool>" otherwise.
func ExecutorUser(pool string) string {
	if pool == bus.DefaultPool {
		return "executor"
	}
	return "executor-" + pool
}

// ServiceUsers returns the users of the ACTIONBUS account: admin (no
// restriction) and the dispatcher, with the permissions of
// [serviceUsers] (the dispatcher's naming every pool's artifact store).
// The planner, the auditor and the executors are users of accounts of
// their own ([OwnAccounts]).
func ServiceUsers(pools ...string) []User {
	if len(pools) == 0 {
		pools = []string{bus.DefaultPool}
	}
	var out []User
	for _, u := range serviceUsers {
		if u.perPool || u.account != "" {
			continue
		}
		p := u.perms("")
		for _, pool := range pools {
			r := strings.NewReplacer("{pool}", pool)
			for _, s := range u.eachPool {
				p.Pub = append(p.Pub, r.Replace(s))
			}
		}
		out = append(out, User{Name: u.name, Permissions: p})
	}
	return out
}

// AllServiceUsers returns every service user: [ServiceUsers] and the
// users of [OwnAccounts].
func AllServiceUsers(pools ...string) []User {
	out := ServiceUsers(pools...)
	for _, a := range OwnAccounts(pools...) {
		out = append(out, a.User)
	}
	return out
}

// ExecutorUsers returns the executor user of each pool (default
// ["default"]), each the one user of its pool's account ([PoolAccount]).
func ExecutorUsers(pools ...string) []User {
	if len(pools) == 0 {
		pools = []string{bus.DefaultPool}
	}
	out := make([]User, len(pools))
	for i, pool := range pools {
		out[i] = User{Name: ExecutorUser(pool), Permissions: executor.perms(pool)}
	}
	return out
}

func (u serviceUser) perms(pool string) Permissions {
	r := strings.NewReplacer("{pool}", pool)
	var p Permissions
	for _, s := range u.pub {
		p.Pub = append(p.Pub, r.Replace(s))
	}
	for partition := range bus.MaxPartitions {
		r := strings.NewReplacer("{partition}", strconv.Itoa(partition))
		for _, s := range u.eachPartition {
			p.Pub = append(p.Pub, r.Replace(s))
		}
	}
	for _, s := range u.sub {
		p.Sub = append(p.Sub, r.Replace(s))
	}
	if u.viaLeaf {
		p.Pub = domainForms(p.Pub, JetStreamDomain)
	}
	p.AllowResponses = u.allowResponses
	return p
}
