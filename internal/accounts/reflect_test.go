package accounts_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/bus"
)

func TestNoUntrustedUserDirectGetsAStoreItWrites(t *testing.T) {
	pools := []string{bus.DefaultPool, "gpu"}
	topo := bus.Topology{Pools: pools}
	assert.Empty(t, accounts.DirectGetsOfOwnWrites(topo, accounts.AllServiceUsers(pools...)))
}

// TestDirectGetsOfOwnWritesFindsEachForm keeps the rule from passing for
// want of looking: a user given a direct get of a store it writes, in
// the hub's form, the leaf node's form or through a wildcard, is named.
func TestDirectGetsOfOwnWritesFindsEachForm(t *testing.T) {
	topo := bus.Topology{Pools: []string{bus.DefaultPool}}
	for name, c := range map[string]struct {
		pub  []string
		want string
	}{
		"artifact store": {[]string{"$O.ab_artifacts_default.>", "$JS.API.DIRECT.GET.OBJ_ab_artifacts_default.>"},
			"executor writes OBJ_ab_artifacts_default ($O.ab_artifacts_default.>) and direct-gets it ($JS.API.DIRECT.GET.OBJ_ab_artifacts_default.>)"},
		"a bucket through a leaf node": {[]string{"$JS.actionbus.API.$KV.ab_idempotency_default.>", "$JS.actionbus.API.DIRECT.GET.KV_ab_idempotency_default.>"},
			"executor writes KV_ab_idempotency_default ($KV.ab_idempotency_default.>) and direct-gets it ($JS.API.DIRECT.GET.KV_ab_idempotency_default.>)"},
		"a stream through a wildcard": {[]string{"ab.audit.*.*.*", "$JS.API.DIRECT.GET.*"},
			"executor writes AB_AUDIT (ab.audit.*.*.*) and direct-gets it ($JS.API.DIRECT.GET.*)"},
	} {
		t.Run(name, func(t *testing.T) {
			got := accounts.DirectGetsOfOwnWrites(topo, []accounts.User{{Name: "executor", Permissions: accounts.Permissions{Pub: c.pub}}})
			assert.Equal(t, []string{c.want}, got)
		})
	}
	assert.Empty(t, accounts.DirectGetsOfOwnWrites(topo, []accounts.User{{Name: "planner", Permissions: accounts.Permissions{
		Pub: []string{"$KV.ab_planner_limits.>", "$JS.API.DIRECT.GET.KV_ab_catalog.>"}}}}), "a direct get of a store the user does not write")
}

func TestNoUserOfTheServicesAccountListensOnAStoredSubject(t *testing.T) {
	pools := []string{bus.DefaultPool, "gpu"}
	topo := bus.Topology{Pools: pools}
	assert.Empty(t, accounts.StoredSubjectsHeard(topo, accounts.AllServiceUsers(pools...)))
}

// TestStoredSubjectsHeardFindsOne keeps the rule from passing for want of
// looking: a user of ACTIONBUS given a subscription on a run's events or
// on a bucket's keys is named; admin, and a user of an account of its own,
// are not.
func TestStoredSubjectsHeardFindsOne(t *testing.T) {
	topo := bus.Topology{Pools: []string{bus.DefaultPool}}
	got := accounts.StoredSubjectsHeard(topo, []accounts.User{
		{Name: "dispatcher", Permissions: accounts.Permissions{Sub: []string{"_INBOX_dispatcher.>", "$KV.ab_runs.*"}}},
		{Name: "admin", Permissions: accounts.Permissions{Sub: []string{">"}}},
		{Name: "planner", Permissions: accounts.Permissions{Sub: []string{"$KV.ab_runs.*"}}},
	})
	assert.Equal(t, []string{"dispatcher may subscribe to $KV.ab_runs.*, which KV_ab_runs stores ($KV.ab_runs.>)"}, got)
}

func TestNoUserOfAnAccountOfItsOwnCreatesAConsumer(t *testing.T) {
	pools := []string{bus.DefaultPool, "gpu"}
	assert.Empty(t, accounts.ConsumerCreators(accounts.AllServiceUsers(pools...)))
}

// TestConsumerCreatorsFindsEachForm keeps the rule from passing for want
// of looking: a create in each of the API's forms, the leaf-node form and
// a wildcard that covers one are named, for a user of an account of its
// own only.
func TestConsumerCreatorsFindsEachForm(t *testing.T) {
	for _, pub := range []string{
		"$JS.API.CONSUMER.CREATE.KV_ab_catalog.>",
		"$JS.API.CONSUMER.CREATE.AB_AUDIT.sink-jsonl.>",
		"$JS.API.CONSUMER.DURABLE.CREATE.AB_RUNS.x",
		"$JS.actionbus.API.CONSUMER.CREATE.AB_WORK",
		"$JS.API.>",
	} {
		t.Run(pub, func(t *testing.T) {
			got := accounts.ConsumerCreators([]accounts.User{
				{Name: "auditor", Permissions: accounts.Permissions{Pub: []string{"$JS.API.CONSUMER.INFO.AB_AUDIT.sink-jsonl", pub}}},
				{Name: "dispatcher", Permissions: accounts.Permissions{Pub: []string{pub}}},
			})
			assert.Equal(t, []string{"auditor may publish " + pub + ", which creates a consumer"}, got)
		})
	}
}
