// Package natsconf holds the deployment's static NATS configuration
// (accounts.conf: the ACTIONBUS account with the least-privilege user of
// every service, and one account per tenant) for programs and tests that start a server with
// it, such as actionbustest with Options.Users. The layout itself is
// internal/accounts'; accounts.conf is its static rendering.
package natsconf

import (
	_ "embed"
	"strconv"
	"strings"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/bus"
)

// shipped is accounts.conf as shipped: the services' account and the
// accounts of the tenants default, acme and globex.
//
//go:embed accounts.conf
var shipped string

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

// header is the comment accounts.conf starts with.
const header = `# actionbus accounts (default subject prefix "ab"), rendered from
# internal/accounts (the layout operator mode signs as JWTs): regenerate
# rather than edit (a test compares).
#
# Three kinds of account, and what crosses between them is an explicit
# export/import (docs/tenants.md):
#
# - ACTIONBUS, the services' account: every stream, bucket and object store,
#   and one least-privilege user per service. Every service user may publish
#   only the events it produces, use only the JetStream API of the streams,
#   consumers and buckets it needs, and receive replies only on its own inbox
#   prefix (services connect with nats.CustomInboxPrefix("_INBOX_<service>")).
#   Only admin and the dispatcher are its users.
# - Accounts of their own, with no JetStream, for the planner (PLANNER), the
#   auditor (AUDITOR) and each executor pool (POOL_<pool>: executor, or
#   executor-<pool>): the user, service imports of exactly what it may
#   send, stream imports of what it may receive. A reply such a user names
#   crosses as one the server made up in ACTIONBUS, so JetStream's answers
#   land nowhere but back.
# - One account per tenant, holding nothing of the services': no JetStream,
#   no stream, bucket or inbox of ACTIONBUS. A tenant's users start, answer
#   and cancel its runs through service imports of exactly its own subjects
#   (ab.run.<tenant>.<runId>.<verb>: JetStream's publish ack is the reply),
#   read its runs, audit records, artifacts and the catalog through the read
#   service (ab.api.<tenant>.<op>), and receive its runs' live events and
#   audit records through stream imports of its own subjects. A subject
#   naming another tenant reaches no import: inboxes, delivery subjects and
#   replies are the account's own by construction.
#
# Passwords come from the environment ($ADMIN_PASSWORD, ...); run
# "actionbus provision" as admin. This file ships with the tenants default,
# acme and globex; "actionbus tenant users <tenant>" prints another tenant's
# account block (add the tenant to the accounts list of every export too).
# Operator mode adds tenants without editing this file or restarting
# (docs/operations.md).
`

// WithTenants returns accounts.conf for the default tenant and tenants
// (each once): the services' account, whose exports list them, and one
// account per tenant, rendered from internal/accounts.
func WithTenants(tenants ...string) string {
	var all []string
	seen := map[string]bool{}
	for _, t := range append([]string{DefaultTenant}, tenants...) {
		if !seen[t] {
			seen[t] = true
			all = append(all, t)
		}
	}
	return header + accounts.StaticConfig(events.DefaultPrefix, all, accounts.Limits{}, bus.DefaultPool)
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

// ClientUser returns the name of a tenant's client user: "client" for the
// default tenant, "client-<tenant>" otherwise (user names are unique
// across a server's accounts).
func ClientUser(tenant string) string { return accounts.ClientUser(tenant) }

// ApproverUser returns the name of a tenant's approver user: "approver"
// for the default tenant, "approver-<tenant>" otherwise.
func ApproverUser(tenant string) string { return accounts.ApproverUser(tenant) }

// PasswordVar returns the environment variable holding user's password
// (without the $): CLIENT_ACME_PASSWORD for client-acme.
func PasswordVar(user string) string { return accounts.PasswordVar(user) }

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
