package accounts

import (
	"slices"
	"strings"
)

// serviceUser is one ACTIONBUS user of the services: what it may publish
// and subscribe to. "{pool}" stands for the executor's pool in pub and
// sub of a perPool user; eachPool lines are repeated for every pool (a
// stream name cannot hold a wildcard). allowResponses lets it answer
// requests on their reply subjects (the registrar, the read service).
type serviceUser struct {
	name     string
	perPool  bool
	pub      []string
	eachPool []string
	// eachPartition lines are repeated for every partition a deployment
	// may have ({partition}: 0 to [bus.MaxPartitions]-1).
	eachPartition  []string
	sub            []string
	allowResponses bool
	// viaLeaf users may connect through a leaf node (an executor next to
	// its data): their JetStream API, KV and object store subjects are
	// allowed in the hub domain's form too ([JetStreamDomain]), the only
	// form JetStream's API crosses a leaf node link in.
	viaLeaf bool
	// account names the account of its own the user lives in (see
	// [OwnAccounts]); "" for a user of ACTIONBUS. A perPool user's is
	// its pool's ([PoolAccount]).
	account string
}

// JetStreamDomain is the JetStream domain of the deployment's cluster
// (deploy/nats: jetstream { domain: actionbus }). A client behind a leaf
// node reaches JetStream by it ($JS.actionbus.API.>), since the server
// never lets the plain $JS.API.> cross a leaf node link.
const JetStreamDomain = "actionbus"

// domainForms returns pub with the leaf-node form of every JetStream API
// and KV subject added: "$JS.API.X" as "$JS.<domain>.API.X", "$KV.X" as
// "$JS.<domain>.API.$KV.X" (nats-server maps them back in the hub's
// account, and denies their plain forms on a leaf link). An object
// store's "$O." subjects cross a leaf link as they are.
func domainForms(pub []string, domain string) []string {
	out := slices.Clone(pub)
	prefix := "$JS." + domain + ".API."
	for _, s := range pub {
		switch {
		case strings.HasPrefix(s, "$JS.API."):
			out = append(out, prefix+strings.TrimPrefix(s, "$JS.API."))
		case strings.HasPrefix(s, "$KV."):
			out = append(out, prefix+s)
		}
	}
	return out
}

// serviceUsers are the service users' permissions in operator mode, the
// same table deploy/nats/accounts.conf is rendered from (default prefix
// "ab"). admin has no restriction.
var serviceUsers = []serviceUser{
	{name: "admin"},
	{name: "dispatcher",
		pub: []string{
			"ab.run.*.*.started", "ab.run.*.*.step", "ab.run.*.*.progress", "ab.run.*.*.decide",
			"ab.run.*.*.completed", "ab.run.*.*.failed", "ab.run.*.*.canceled", "ab.run.*.*.sched.*",
			"ab.run.*.*.approval", "ab.run.*.*.synthesize", "ab.pool.*.request", "ab.pool.*.ended", "ab.rejected.>",
			// The partitions' fences (see Subjects.Fence).
			"ab.fence.*",
			// The ingress: the requests stream's only writer.
			"ab.ingress.*.*.requested", "ab.ingress.*.*.cancel", "ab.ingress.*.*.input", "ab.ingress.*.*.approve",
			"ab.ingress.*.*.deny",
			"$JS.API.STREAM.INFO.AB_RUNS", "$JS.API.STREAM.INFO.AB_REQUESTS", "$JS.API.STREAM.INFO.AB_WORK",
			"$JS.API.STREAM.INFO.AB_REJECTED", "$JS.API.STREAM.INFO.AB_TIMERS", "$JS.API.STREAM.PURGE.AB_TIMERS",
			// The dispatchers' presence, from which each derives the
			// partitions it owns.
			"$JS.API.STREAM.INFO.KV_ab_dispatchers", "$KV.ab_dispatchers.>", "$JS.API.CONSUMER.CREATE.KV_ab_dispatchers.>",
			"$JS.API.CONSUMER.DELETE.KV_ab_dispatchers.>", "$JS.FC.KV_ab_dispatchers.>",
			"$JS.API.STREAM.INFO.KV_ab_runs", "$JS.API.STREAM.MSG.GET.KV_ab_runs", "$JS.API.DIRECT.GET.KV_ab_runs.>",
			"$KV.ab_runs.>", "$JS.API.STREAM.INFO.KV_ab_limits", "$JS.API.STREAM.MSG.GET.KV_ab_limits",
			"$JS.API.DIRECT.GET.KV_ab_limits.>", "$KV.ab_limits.>", "$JS.API.STREAM.INFO.KV_ab_catalog",
			"$JS.API.DIRECT.GET.KV_ab_catalog.>", "$JS.API.CONSUMER.CREATE.KV_ab_catalog.>",
			"$JS.API.CONSUMER.DELETE.KV_ab_catalog.>", "$JS.API.CONSUMER.INFO.KV_ab_catalog.>",
			"$JS.FC.KV_ab_catalog.>", "$JS.API.STREAM.INFO.KV_ab_policy", "$JS.API.CONSUMER.CREATE.KV_ab_policy.>",
			"$JS.API.CONSUMER.DELETE.KV_ab_policy.>", "$JS.FC.KV_ab_policy.>", "$JS.API.STREAM.INFO.OBJ_ab_artifacts",
			"$O.ab_artifacts.>", "$JS.API.STREAM.MSG.GET.OBJ_ab_artifacts",
			"$JS.API.CONSUMER.CREATE.OBJ_ab_artifacts.>", "$JS.API.CONSUMER.DELETE.OBJ_ab_artifacts.>",
			"$JS.FC.OBJ_ab_artifacts.>",
			// The registrar: it alone writes the catalog and its owners.
			"$JS.API.STREAM.NAMES", "$KV.ab_catalog.>", "$JS.API.STREAM.MSG.GET.KV_ab_catalog",
			"$JS.API.STREAM.INFO.KV_ab_catalog_owners", "$JS.API.DIRECT.GET.KV_ab_catalog_owners.>",
			"$JS.API.STREAM.MSG.GET.KV_ab_catalog_owners", "$KV.ab_catalog_owners.>",
			// The read service: direct gets of the runs, requests and audit
			// streams and the catalog (artifact stores answer none: they
			// are read with the message get).
			"$JS.API.STREAM.INFO.AB_AUDIT", "$JS.API.DIRECT.GET.AB_RUNS", "$JS.API.DIRECT.GET.AB_REQUESTS",
			"$JS.API.DIRECT.GET.AB_AUDIT",
			// A run's log, to repair its end or replay it: its requests,
			// results and fired timers, with batch direct gets.
			"$JS.API.DIRECT.GET.AB_TIMERS", "$JS.API.DIRECT.GET.KV_ab_catalog",
		},
		// Each partition's three consumers, pulled (pinned), acknowledged
		// and unpinned when the partition is handed to another dispatcher.
		eachPartition: []string{
			"$JS.API.CONSUMER.INFO.AB_RUNS.dispatcher-p{partition}", "$JS.API.CONSUMER.MSG.NEXT.AB_RUNS.dispatcher-p{partition}",
			"$JS.ACK.AB_RUNS.dispatcher-p{partition}.>", "$JS.API.CONSUMER.UNPIN.AB_RUNS.dispatcher-p{partition}",
			"$JS.API.CONSUMER.INFO.AB_REQUESTS.dispatcher-requests-p{partition}",
			"$JS.API.CONSUMER.MSG.NEXT.AB_REQUESTS.dispatcher-requests-p{partition}",
			"$JS.ACK.AB_REQUESTS.dispatcher-requests-p{partition}.>", "$JS.API.CONSUMER.UNPIN.AB_REQUESTS.dispatcher-requests-p{partition}",
			"$JS.API.CONSUMER.INFO.AB_TIMERS.dispatcher-timers-p{partition}",
			"$JS.API.CONSUMER.MSG.NEXT.AB_TIMERS.dispatcher-timers-p{partition}",
			"$JS.ACK.AB_TIMERS.dispatcher-timers-p{partition}.>", "$JS.API.CONSUMER.UNPIN.AB_TIMERS.dispatcher-timers-p{partition}",
		},
		// The pools' artifact stores, read for workflows and tenants.
		eachPool: []string{
			"$JS.API.STREAM.INFO.OBJ_ab_artifacts_{pool}", "$JS.API.STREAM.MSG.GET.OBJ_ab_artifacts_{pool}",
			"$JS.API.CONSUMER.CREATE.OBJ_ab_artifacts_{pool}.>", "$JS.API.CONSUMER.DELETE.OBJ_ab_artifacts_{pool}.>",
			"$JS.FC.OBJ_ab_artifacts_{pool}.>",
		},
		sub: []string{
			"_INBOX_dispatcher.>",
			// The registrar's announcements and the read service's requests
			// (a NATS micro service: its discovery subjects too).
			"ab.pool.*.announce", "ab.api.*.>",
			// The ingress: tenants' requests, cancels, inputs, approvals.
			"ab.run.*.*.requested", "ab.run.*.*.cancel", "ab.run.*.*.input", "ab.run.*.*.approve", "ab.run.*.*.deny",
			"$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.*.actionbus-read", "$SRV.*.actionbus-read.*",
		},
		allowResponses: true,
	},
	{name: "planner", account: PlannerAccount,
		pub: []string{
			"ab.run.*.*.decision", "ab.run.*.*.synthesized", "ab.stream.*.*", "ab.rejected.>",
			"$JS.API.STREAM.INFO.KV_ab_planner_limits", "$JS.API.STREAM.MSG.GET.KV_ab_planner_limits",
			"$KV.ab_planner_limits.>", "$JS.API.STREAM.INFO.AB_RUNS",
			"$JS.API.STREAM.INFO.AB_REJECTED", "$JS.API.CONSUMER.INFO.AB_RUNS.planner",
			"$JS.API.CONSUMER.MSG.NEXT.AB_RUNS.planner", "$JS.ACK.AB_RUNS.planner.>",
			// The catalog, followed with direct gets (never a consumer:
			// see [ConsumerCreators]).
			"$JS.API.STREAM.INFO.KV_ab_catalog", "$JS.API.DIRECT.GET.KV_ab_catalog",
			"$JS.API.DIRECT.GET.KV_ab_catalog.>",
		},
		sub: []string{
			"_INBOX_planner.>",
		},
	},
	{name: "auditor", account: AuditorAccount,
		pub: []string{
			"ab.audit.*.*.*", "ab.rejected.>", "$JS.API.STREAM.INFO.AB_RUNS", "$JS.API.STREAM.INFO.AB_REQUESTS",
			"$JS.API.STREAM.INFO.AB_WORK", "$JS.API.STREAM.INFO.AB_REJECTED", "$JS.API.STREAM.INFO.AB_AUDIT",
			"$JS.API.CONSUMER.INFO.AB_RUNS.auditor-runs", "$JS.API.CONSUMER.MSG.NEXT.AB_RUNS.auditor-runs",
			"$JS.ACK.AB_RUNS.auditor-runs.>", "$JS.API.STREAM.INFO.AB_TIMERS",
			"$JS.API.CONSUMER.INFO.AB_TIMERS.auditor-timers", "$JS.API.CONSUMER.MSG.NEXT.AB_TIMERS.auditor-timers",
			"$JS.ACK.AB_TIMERS.auditor-timers.>", "$JS.API.CONSUMER.INFO.AB_REQUESTS.auditor-requests",
			"$JS.API.CONSUMER.MSG.NEXT.AB_REQUESTS.auditor-requests", "$JS.ACK.AB_REQUESTS.auditor-requests.>",
			"$JS.API.CONSUMER.INFO.AB_WORK.auditor-work", "$JS.API.CONSUMER.MSG.NEXT.AB_WORK.auditor-work",
			"$JS.ACK.AB_WORK.auditor-work.>", "$JS.API.CONSUMER.INFO.AB_REJECTED.auditor-rejected",
			"$JS.API.CONSUMER.MSG.NEXT.AB_REJECTED.auditor-rejected", "$JS.ACK.AB_REJECTED.auditor-rejected.>",
			// Its chains' ends, with the message get: it writes the
			// audit stream, so it may not direct-get it.
			"$JS.API.STREAM.MSG.GET.AB_AUDIT",
			// The sinks' consumers, which provisioning creates.
			"$JS.API.CONSUMER.INFO.AB_AUDIT.sink-jsonl", "$JS.API.CONSUMER.INFO.AB_AUDIT.sink-sqlite",
			"$JS.API.CONSUMER.MSG.NEXT.AB_AUDIT.sink-jsonl", "$JS.ACK.AB_AUDIT.sink-jsonl.>",
			"$JS.API.CONSUMER.MSG.NEXT.AB_AUDIT.sink-sqlite", "$JS.ACK.AB_AUDIT.sink-sqlite.>",
			// The catalog, followed with direct gets.
			"$JS.API.STREAM.INFO.KV_ab_catalog", "$JS.API.DIRECT.GET.KV_ab_catalog",
			"$JS.API.DIRECT.GET.KV_ab_catalog.>",
		},
		sub: []string{
			"_INBOX_auditor.>",
		},
	},
}

// executor is the users of the pools' executors, one per pool, each in
// its pool's account ([PoolAccount]): what it publishes crosses from
// there into ACTIONBUS as service imports, what it receives as stream
// imports ([PoolCrossings]).
var executor = serviceUser{name: "executor", perPool: true, viaLeaf: true,
	pub: []string{
		"ab.run.*.*.result", "ab.rejected.>", "$JS.API.STREAM.INFO.AB_RUNS", "$JS.API.STREAM.INFO.AB_WORK",
		"$JS.API.STREAM.INFO.AB_REJECTED", "$JS.API.CONSUMER.INFO.AB_WORK.pool-{pool}",
		"$JS.API.CONSUMER.MSG.NEXT.AB_WORK.pool-{pool}", "$JS.ACK.AB_WORK.pool-{pool}.>",
		// Its announcements; the registrar writes the catalog.
		"ab.pool.{pool}.announce",
		// Stores of its pool's own: nobody else relies on them.
		"$JS.API.STREAM.INFO.KV_ab_presence_{pool}", "$KV.ab_presence_{pool}.>",
		// Read with the message get, never a direct get: it writes
		// them (see [DirectGetsOfOwnWrites]).
		"$JS.API.STREAM.INFO.KV_ab_idempotency_{pool}", "$JS.API.STREAM.MSG.GET.KV_ab_idempotency_{pool}",
		"$KV.ab_idempotency_{pool}.>",
		"$JS.API.STREAM.INFO.OBJ_ab_artifacts_{pool}", "$O.ab_artifacts_{pool}.>",
		"$JS.API.STREAM.MSG.GET.OBJ_ab_artifacts_{pool}",
	},
	sub: []string{
		"_INBOX_executor.>", "ab.pool.{pool}.ended",
	},
}
