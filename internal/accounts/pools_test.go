package accounts_test

import (
	"slices"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/accounts"
)

// A pool's account imports exactly what its executor user may publish
// (services, each under every name the user may send it by, the leaf
// node's domain form too) and receive (streams, its inbox aside), and the
// account information request that keeps the server from answering for
// the account: nothing else of ACTIONBUS crosses, and nothing the user
// needs is missing.
func TestAPoolAccountImportsExactlyWhatItsExecutorMaySend(t *testing.T) {
	u := accounts.ExecutorUsers("gpu")[0]
	assert.Equal(t, "executor-gpu", u.Name)
	assert.Equal(t, "POOL_gpu", accounts.AccountOf(u.Name))
	assert.Equal(t, "POOL_default", accounts.AccountOf("executor"))
	assert.Equal(t, accounts.ServiceAccount, accounts.AccountOf("dispatcher"))
	var local, streams []string
	for _, c := range accounts.PoolCrossings("gpu") {
		name := c.Subject
		if c.Local != "" {
			name = c.Local
		}
		if c.Kind == jwt.Stream {
			streams = append(streams, name)
			continue
		}
		local = append(local, name)
		assert.Equal(t, c.Subject == "$JS.API.CONSUMER.MSG.NEXT.AB_WORK.pool-gpu", c.Response == jwt.ResponseTypeStream,
			"%s: only a pull request has many answers", c.Subject)
	}
	assert.ElementsMatch(t, append(slices.Clone(u.Permissions.Pub), "$JS.API.INFO"), local)
	assert.Equal(t, []string{"ab.pool.gpu.ended"}, streams)
	assert.NotContains(t, u.Permissions.Pub, "$JS.API.INFO", "the executor may not send what is imported only to silence the server")
}

func TestOwnAccountClaimsAreValidAndExportedToTheirAccountAlone(t *testing.T) {
	svc, err := nkeys.CreateAccount()
	require.NoError(t, err)
	svcPub, _ := svc.PublicKey()
	sc := accounts.ServiceAccountClaims(svcPub, "ab", "gpu")
	own := accounts.OwnAccounts("gpu")
	var names []string
	for _, a := range own {
		names = append(names, a.Name+"/"+a.User.Name)
	}
	assert.Equal(t, []string{"PLANNER/planner", "AUDITOR/auditor", "POOL_gpu/executor-gpu"}, names)
	for _, a := range own {
		assert.Equal(t, a.Name, accounts.AccountOf(a.User.Name))
		kp, err := nkeys.CreateAccount()
		require.NoError(t, err)
		pub, _ := kp.PublicKey()
		ac, err := accounts.OwnAccountClaims(a, pub, "ab", svc)
		require.NoError(t, err)
		vr := jwt.CreateValidationResults()
		ac.Validate(vr)
		require.False(t, vr.IsBlocking(true), "%s: %v", a.Name, vr.Errors())
		assert.False(t, ac.Limits.IsJSEnabled(), "%s has no JetStream", a.Name)
		assert.Len(t, ac.Imports, len(a.Crossings))
		for _, e := range ac.Exports {
			assert.True(t, e.TokenReq, "%s exports %s to tenants, token required", a.Name, e.Subject)
		}
		for _, imp := range ac.Imports {
			act, err := jwt.DecodeActivationClaims(imp.Token)
			require.NoError(t, err)
			assert.Equal(t, pub, act.Subject, "%s: activated for %s", imp.Subject, a.Name)
			assert.Equal(t, imp.Subject, act.ImportSubject)
			var exported bool
			for _, e := range sc.Exports {
				exported = exported || (e.TokenReq && e.Subject == imp.Subject && e.Type == imp.Type)
			}
			assert.True(t, exported, "%s: exported by ACTIONBUS, token required", imp.Subject)
		}
	}
}

// No account of its own imports its user's inbox in ACTIONBUS: answers
// to its requests cross back through its service imports, and nothing in
// ACTIONBUS publishes to that inbox on its behalf (it creates no consumer,
// whose deliveries would: the planner and the auditor follow the catalog
// with direct gets).
func TestNoAccountOfItsOwnImportsItsInbox(t *testing.T) {
	for _, a := range accounts.OwnAccounts() {
		var inbox bool
		for _, c := range a.Crossings {
			inbox = inbox || (c.Kind == jwt.Stream && c.Subject == accounts.InboxPrefix(a.User.Name)+".>")
		}
		assert.False(t, inbox, a.Name)
	}
}
