package policy_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/policy"
)

func approvalCtx() policy.ApprovalContext {
	return policy.ApprovalContext{ApprovalID: "R1-2-0", RunID: "R1", StepID: "C1", UserID: "operator_1", Action: "delivery.executeRetry",
		InputHash: "5d41402abc4b2a76b9719d911017c592aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", ResourceIDs: []string{"job_1"},
		DryRunHash: "d1", ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Second)}
}

func TestApprovalTokens(t *testing.T) {
	k1 := []byte("0123456789abcdef0123456789abcdef")
	k2 := []byte("fedcba9876543210fedcba9876543210")
	keys := policy.Keys{"k1": {Secret: k1}, "k2": {Secret: k2, Holder: "bob"}}
	ctx := approvalCtx()
	now := time.Now()
	token, err := policy.Sign("k1", k1, ctx)
	require.NoError(t, err)
	who, err := keys.Verify(token, ctx, "", now)
	require.NoError(t, err, "a valid token")
	assert.Equal(t, "k1", who, "a key held by nobody named is held by its id's user")

	tamper := map[string]func(*policy.ApprovalContext){
		"approvalId":  func(c *policy.ApprovalContext) { c.ApprovalID = "R1-2-1" },
		"runId":       func(c *policy.ApprovalContext) { c.RunID = "R2" },
		"stepId":      func(c *policy.ApprovalContext) { c.StepID = "C2" },
		"userId":      func(c *policy.ApprovalContext) { c.UserID = "mallory" },
		"action":      func(c *policy.ApprovalContext) { c.Action = "delivery.deleteAll" },
		"inputHash":   func(c *policy.ApprovalContext) { c.InputHash = "00" + c.InputHash[2:] },
		"resourceIds": func(c *policy.ApprovalContext) { c.ResourceIDs = []string{"job_1", "job_2"} },
		"dryRunHash":  func(c *policy.ApprovalContext) { c.DryRunHash = "d2" },
		"expiresAt":   func(c *policy.ApprovalContext) { c.ExpiresAt = c.ExpiresAt.Add(time.Hour) },
	}
	for field, f := range tamper {
		t.Run("tampered "+field, func(t *testing.T) {
			stored := approvalCtx()
			f(&stored)
			_, err := keys.Verify(token, stored, "", now)
			assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(err), "%v", err)
		})
	}
	t.Run("expired", func(t *testing.T) {
		_, err := keys.Verify(token, ctx, "", ctx.ExpiresAt.Add(time.Second))
		assert.Equal(t, actionbus.CodeApprovalExpired, actionbus.CodeOf(err))
	})
	t.Run("rotated key: both keys verify while both are configured", func(t *testing.T) {
		t2, err := policy.Sign("k2", k2, ctx)
		require.NoError(t, err)
		who, err := keys.Verify(t2, ctx, "k2", now)
		assert.NoError(t, err)
		assert.Equal(t, "bob", who, "the key's holder approves")
		_, err = policy.Keys{"k2": {Secret: k2}}.Verify(token, ctx, "", now)
		assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(err), "a retired key no longer verifies")
	})
	t.Run("signed with the wrong secret", func(t *testing.T) {
		forged, err := policy.Sign("k1", k2, ctx)
		require.NoError(t, err)
		_, err = keys.Verify(forged, ctx, "", now)
		assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(err))
	})
	t.Run("malformed", func(t *testing.T) {
		_, err := keys.Verify("nodot", ctx, "", now)
		assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(err))
	})
}

// TestAnApproverIsWhoTheKeyAuthenticates: a grant names its approver from
// the key that signed it, never from a name the approver typed, and never
// blank.
func TestAnApproverIsWhoTheKeyAuthenticates(t *testing.T) {
	own, gw := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	keys := policy.Keys{"alice-2026": {Secret: own, Holder: "alice"}, "console": {Secret: gw, Gateway: true}}
	ctx, now := approvalCtx(), time.Now()
	mine, err := policy.Sign("alice-2026", own, ctx)
	require.NoError(t, err)
	asBob, err := policy.SignAs("console", gw, ctx, "bob")
	require.NoError(t, err)
	plain, err := policy.Sign("console", gw, ctx)
	require.NoError(t, err)
	cases := []struct {
		name, token, claimed, want string
	}{
		{"own key, no name", mine, "", "alice"},
		{"own key, named by key id", mine, "alice-2026", "alice"},
		{"own key, named by holder", mine, "alice", "alice"},
		{"own key, naming someone else", mine, "mallory", ""},
		{"gateway key names the user it signed", asBob, "bob", "bob"},
		{"gateway grant renamed", asBob, "mallory", ""},
		{"gateway grant without a name", plain, "", ""},
		{"gateway grant signed without the name", plain, "bob", ""},
		{"gateway grant with a blank name", asBob, " ", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			who, err := keys.Verify(c.token, ctx, c.claimed, now)
			if c.want == "" {
				assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(err), "approver %q", who)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, who)
		})
	}
}

// TestAPrincipalIsBelievedOnlyFromAGateway: a run's roles come from a
// statement a gateway signed for exactly that run, tenant and user.
func TestAPrincipalIsBelievedOnlyFromAGateway(t *testing.T) {
	own, gw := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	keys := policy.Keys{"alice": {Secret: own}, "console": {Secret: gw, Gateway: true}}
	now := time.Now()
	claim := policy.PrincipalClaim{RunID: "R1", Tenant: "acme", User: "alice", Roles: []string{"finance"}, ExpiresAt: now.Add(time.Hour)}
	token, err := policy.SignPrincipal("console", gw, claim)
	require.NoError(t, err)
	p, err := keys.VerifyPrincipal(token, claim, now)
	require.NoError(t, err)
	assert.Equal(t, policy.Principal{Tenant: "acme", Gateway: "console", User: "alice", Grants: policy.Grants{Roles: []string{"finance"}}}, p)

	byApprover, err := policy.SignPrincipal("alice", own, claim)
	require.NoError(t, err)
	tamper := map[string]func(*policy.PrincipalClaim){
		"runId":  func(c *policy.PrincipalClaim) { c.RunID = "R2" },
		"tenant": func(c *policy.PrincipalClaim) { c.Tenant = "globex" },
		"user":   func(c *policy.PrincipalClaim) { c.User = "mallory" },
		"roles":  func(c *policy.PrincipalClaim) { c.Roles = append(c.Roles, "admin") },
		"scopes": func(c *policy.PrincipalClaim) { c.Scopes = []string{"actions:run"} },
		"expiry": func(c *policy.PrincipalClaim) { c.ExpiresAt = c.ExpiresAt.Add(24 * time.Hour) },
	}
	for field, f := range tamper {
		t.Run("tampered "+field, func(t *testing.T) {
			c := claim
			f(&c)
			_, err := keys.VerifyPrincipal(token, c, now)
			assert.Equal(t, actionbus.CodeUnauthenticated, actionbus.CodeOf(err))
		})
	}
	_, err = keys.VerifyPrincipal(byApprover, claim, now)
	assert.Equal(t, actionbus.CodeUnauthenticated, actionbus.CodeOf(err), "an approver's own key is not a gateway's")
	_, err = keys.VerifyPrincipal("nodot", claim, now)
	assert.Equal(t, actionbus.CodeUnauthenticated, actionbus.CodeOf(err))
	// Replayed once the run's state is gone (a week on), the statement
	// has long expired.
	_, err = keys.VerifyPrincipal(token, claim, now.Add(7*24*time.Hour))
	assert.Equal(t, actionbus.CodeUnauthenticated, actionbus.CodeOf(err), "an expired principal was believed")
}

func TestParseKeys(t *testing.T) {
	secret := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	k, err := policy.ParseKeys("k1:" + secret + ", k2:" + secret + ":alice, gw:" + secret + ":*")
	require.NoError(t, err)
	assert.Len(t, k, 3)
	assert.Equal(t, policy.Key{Secret: []byte("0123456789abcdef")}, k["k1"])
	assert.Equal(t, "alice", k["k2"].Holder)
	assert.True(t, k["gw"].Gateway)
	for _, bad := range []string{"k1", "k1:!!!", "k1:" + base64.StdEncoding.EncodeToString([]byte("short")), "k.1:" + secret,
		"k 1:" + secret, secret, "k1 " + secret, "k1:" + secret + ":al ice", "k1:" + secret + ":a/b",
		"k1:" + secret + ":al\u200bice", "k1:" + secret + ":\u202eecila", "k1:" + secret + ":al\u00a0ice", "k1:" + secret + ":a\u2028b"} {
		_, err := policy.ParseKeys(bad)
		if assert.Error(t, err, bad) {
			assert.NotContains(t, err.Error(), secret, "a malformed key's error shows its secret")
		}
	}
}

// TestApprovalDocExamples reproduces every worked example of
// docs/approvals.md: the input, its canonical form and its hash.
func TestApprovalDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/approvals.md")
	require.NoError(t, err)
	re := regexp.MustCompile("(?s)input:\\s*```json\\n(.*?)```\\s*canonical:\\s*```\\n(.*?)\\n```\\s*sha256:\\s*`([0-9a-f]{64})`")
	examples := re.FindAllSubmatch(doc, -1)
	require.GreaterOrEqual(t, len(examples), 3, "docs/approvals.md has worked examples")
	for _, ex := range examples {
		var in any
		require.NoError(t, json.Unmarshal(ex[1], &in))
		got, err := policy.InputHash(in)
		require.NoError(t, err)
		assert.Equal(t, string(ex[3]), got, "hash of %s", ex[1])
		canon, err := canonicalForDoc(in)
		require.NoError(t, err)
		assert.Equal(t, string(ex[2]), canon)
	}
}
