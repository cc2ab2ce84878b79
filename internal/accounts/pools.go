package accounts

import (
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/actionbus/actionbus/internal/bus"
)

// The executors of a pool live in an account of their own, as tenants do
// (docs/tenants.md, "Executors"): the account holds nothing but its
// executor user and its imports from ACTIONBUS, exactly what that user may
// publish (service imports) and receive (stream imports). Every reply
// subject a pool's executor names is its own account's: a request crossing
// into ACTIONBUS carries a reply the server made up there (_R_…), so
// JetStream's publish acks and direct-get answers come back to the
// executor and land nowhere else — not on another pool's catalog entry,
// a run's state or the JetStream API, which from the services' account
// they did (A43-1, row 108 of docs/security.md).

// PoolAccount returns the name of pool's executors' account: "POOL_" and
// the pool (pool names are lower case, tenant names too, so no tenant
// account is ever named so).
func PoolAccount(pool string) string { return "POOL_" + pool }

// AccountOf returns the account of a service user: its pool's for an
// executor user ([ExecutorUser]), ACTIONBUS for the others.
func AccountOf(user string) string {
	if user == executor.name {
		return PoolAccount(bus.DefaultPool)
	}
	if pool, ok := strings.CutPrefix(user, executor.name+"-"); ok {
		return PoolAccount(pool)
	}
	return ServiceAccount
}

// PoolCrossings returns what pool's account imports from ACTIONBUS: a
// service import of every subject its executor user may publish, and a
// stream import of every subject it may receive but its inbox. A pull
// request's messages are many answers to one request (a streamed
// response). The JetStream API and key-value subjects are imported a
// second time under the name the hub's JetStream domain gives them
// ($JS.<domain>.API.…, see domainForms): that is how a site behind a
// leaf node asks for them.
func PoolCrossings(pool string) []Crossing {
	u := executor
	u.viaLeaf = false
	p := u.perms(pool)
	var out []Crossing
	for _, s := range p.Pub {
		c := Crossing{Kind: jwt.Service, Subject: s}
		if strings.HasPrefix(s, "$JS.API.CONSUMER.MSG.NEXT.") {
			c.Response = jwt.ResponseTypeStream
		}
		out = append(out, c)
		if d := domainForms([]string{s}, JetStreamDomain); len(d) > 1 {
			c.Local = d[1]
			out = append(out, c)
		}
	}
	for _, s := range p.Sub {
		if !strings.HasPrefix(s, "_INBOX") {
			out = append(out, Crossing{Kind: jwt.Stream, Subject: s})
		}
	}
	// The account information request, which no executor user may send,
	// imported only so that the server leaves the account without its own
	// JetStream API responder: an account without JetStream that imports
	// nothing matching $JS.API.INFO is given one ($JS.API.> from the system
	// account, answering "JetStream not enabled for account"), which would
	// answer every request the imports above carry too, and first
	// (nats-server's enableJetStreamInfoServiceImportOnly, 2.15).
	return append(out, Crossing{Kind: jwt.Service, Subject: accountInfoAPI})
}

// accountInfoAPI is JetStream's account information request.
const accountInfoAPI = "$JS.API.INFO"

// PoolExport is one subject ACTIONBUS exports to pools' accounts: its
// kind, response type and the pools that import it.
type PoolExport struct {
	Kind     jwt.ExportType
	Subject  string
	Response jwt.ResponseType
	Pools    []string
}

// PoolExports returns what ACTIONBUS exports to the accounts of pools, in
// the order of their crossings: one export per subject, naming every pool
// that imports it.
func PoolExports(pools ...string) []PoolExport {
	if len(pools) == 0 {
		pools = []string{bus.DefaultPool}
	}
	var out []PoolExport
	at := map[string]int{}
	for _, pool := range pools {
		for _, c := range PoolCrossings(pool) {
			key := c.Kind.String() + " " + c.Subject
			i, ok := at[key]
			if !ok {
				i = len(out)
				at[key] = i
				out = append(out, PoolExport{Kind: c.Kind, Subject: c.Subject, Response: c.Response})
			}
			if !slices.Contains(out[i].Pools, pool) {
				out[i].Pools = append(out[i].Pools, pool)
			}
		}
	}
	return out
}
