package accounts

import (
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/actionbus/actionbus/internal/bus"
)

// The services that run what actionbus does not control — the planner,
// which talks to a model, the auditor, and above all each pool's
// executors, which run handlers and sit at sites behind leaf nodes — live
// in accounts of their own, as tenants do (docs/tenants.md, "Accounts of
// their own"): such an account holds nothing but its user and its imports
// from ACTIONBUS, exactly what that user may publish (service imports)
// and receive (stream imports). Every reply subject the user names is its
// own account's: a request crossing into ACTIONBUS carries a reply the
// server made up there (_R_…), so JetStream's publish acks, direct-get
// answers and status messages come back to it and land nowhere else —
// not on another pool's catalog entry, a run's state or the JetStream API
// (A43-1, rows 108 and 109 of docs/security.md). Only admin and the
// dispatcher, which owns the run states, are users of ACTIONBUS.

// PoolAccount returns the name of pool's executors' account: "POOL_" and
// the pool (pool names are lower case, tenant names too, so no tenant
// account is ever named so).
func PoolAccount(pool string) string { return "POOL_" + pool }

// AccountOf returns the account of a service user: its own ([OwnAccounts])
// for the planner, the auditor and an executor user ([ExecutorUser]), its
// pool's; ACTIONBUS for admin and the dispatcher.
func AccountOf(user string) string {
	if user == executor.name {
		return PoolAccount(bus.DefaultPool)
	}
	if pool, ok := strings.CutPrefix(user, executor.name+"-"); ok {
		return PoolAccount(pool)
	}
	for _, u := range serviceUsers {
		if u.name == user && u.account != "" {
			return u.account
		}
	}
	return ServiceAccount
}

// OwnAccount is an account of its own: its name, its one user and what
// it imports from ACTIONBUS.
type OwnAccount struct {
	Name      string
	User      User
	Crossings []Crossing
}

// OwnAccounts returns the accounts of their own: the planner's, the
// auditor's and one per pool (default ["default"]).
func OwnAccounts(pools ...string) []OwnAccount {
	if len(pools) == 0 {
		pools = []string{bus.DefaultPool}
	}
	var out []OwnAccount
	for _, u := range serviceUsers {
		if u.account != "" {
			out = append(out, OwnAccount{Name: u.account, User: User{Name: u.name, Permissions: u.perms("")}, Crossings: u.crossings("")})
		}
	}
	for _, pool := range pools {
		out = append(out, OwnAccount{Name: PoolAccount(pool), User: User{Name: ExecutorUser(pool), Permissions: executor.perms(pool)},
			Crossings: executor.crossings(pool)})
	}
	return out
}

// PoolCrossings returns what pool's account imports from ACTIONBUS (see
// [serviceUser.crossings]).
func PoolCrossings(pool string) []Crossing { return executor.crossings(pool) }

// crossings returns what u's own account imports from ACTIONBUS: a
// service import of every subject u may publish, and a stream import of
// every subject it may receive but its inbox: answers to its requests
// cross back through the service imports, and nothing else of ACTIONBUS
// reaches its inbox (no such user creates a consumer, whose deliveries
// would be published in ACTIONBUS: [ConsumerCreators]). A pull request's messages are many answers to one
// request (a streamed response). For a user that comes through leaf nodes,
// the JetStream API and key-value subjects are imported a second time
// under the name the hub's JetStream domain gives them ($JS.<domain>.API.…,
// see domainForms): that is how a site asks for them.
func (u serviceUser) crossings(pool string) []Crossing {
	leaf := u.viaLeaf
	u.viaLeaf = false
	p := u.perms(pool)
	var out []Crossing
	for _, s := range p.Pub {
		c := Crossing{Kind: jwt.Service, Subject: s}
		if manyAnswers(s) {
			c.Response = jwt.ResponseTypeStream
		}
		out = append(out, c)
		if d := domainForms([]string{s}, JetStreamDomain); leaf && len(d) > 1 {
			c.Local = d[1]
			out = append(out, c)
		}
	}
	for _, s := range p.Sub {
		if !strings.HasPrefix(s, "_INBOX") {
			out = append(out, Crossing{Kind: jwt.Stream, Subject: s})
		}
	}
	// The account information request, which the user may not send,
	// imported only so that the server leaves the account without its own
	// JetStream API responder: an account without JetStream that imports
	// nothing matching $JS.API.INFO is given one ($JS.API.> from the system
	// account, answering "JetStream not enabled for account"), which would
	// answer every request the imports above carry too, and first
	// (nats-server's enableJetStreamInfoServiceImportOnly, 2.15).
	return append(out, Crossing{Kind: jwt.Service, Subject: accountInfoAPI})
}

// manyAnswers reports whether a request on subject s is answered by many
// messages: a pull request (its messages), and a direct get of a stream
// without a subject in the request's subject, whose body may ask for a
// batch (jetstreamext.GetBatch: the messages, then an end-of-batch
// status). A direct get by last subject is answered once.
func manyAnswers(s string) bool {
	if strings.HasPrefix(s, "$JS.API.CONSUMER.MSG.NEXT.") {
		return true
	}
	stream, ok := strings.CutPrefix(s, "$JS.API.DIRECT.GET.")
	return ok && !strings.Contains(stream, ".")
}

// accountInfoAPI is JetStream's account information request.
const accountInfoAPI = "$JS.API.INFO"

// OwnExport is one subject ACTIONBUS exports to accounts of their own:
// its kind, response type and the accounts that import it.
type OwnExport struct {
	Kind     jwt.ExportType
	Subject  string
	Response jwt.ResponseType
	Accounts []string
}

// OwnExports returns what ACTIONBUS exports to the accounts of their own
// ([OwnAccounts] of pools), in the order of their crossings: one export
// per subject, naming every account that imports it.
func OwnExports(pools ...string) []OwnExport {
	var out []OwnExport
	at := map[string]int{}
	for _, a := range OwnAccounts(pools...) {
		for _, c := range a.Crossings {
			key := c.Kind.String() + " " + c.Subject
			i, ok := at[key]
			if !ok {
				i = len(out)
				at[key] = i
				out = append(out, OwnExport{Kind: c.Kind, Subject: c.Subject, Response: c.Response})
			}
			if !slices.Contains(out[i].Accounts, a.Name) {
				out[i].Accounts = append(out[i].Accounts, a.Name)
			}
		}
	}
	return out
}
