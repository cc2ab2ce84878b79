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
	keys := policy.Keys{"k1": k1, "k2": k2}
	ctx := approvalCtx()
	now := time.Now()
	token, err := policy.Sign("k1", k1, ctx)
	require.NoError(t, err)
	require.NoError(t, keys.Verify(token, ctx, now), "a valid token")

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
			err := keys.Verify(token, stored, now)
			assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(err), "%v", err)
		})
	}
	t.Run("expired", func(t *testing.T) {
		err := keys.Verify(token, ctx, ctx.ExpiresAt.Add(time.Second))
		assert.Equal(t, actionbus.CodeApprovalExpired, actionbus.CodeOf(err))
	})
	t.Run("rotated key: both keys verify while both are configured", func(t *testing.T) {
		t2, err := policy.Sign("k2", k2, ctx)
		require.NoError(t, err)
		assert.NoError(t, keys.Verify(t2, ctx, now))
		err = policy.Keys{"k2": k2}.Verify(token, ctx, now)
		assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(err), "a retired key no longer verifies")
	})
	t.Run("signed with the wrong secret", func(t *testing.T) {
		forged, err := policy.Sign("k1", k2, ctx)
		require.NoError(t, err)
		assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(keys.Verify(forged, ctx, now)))
	})
	t.Run("malformed", func(t *testing.T) {
		assert.Equal(t, actionbus.CodeApprovalInvalid, actionbus.CodeOf(keys.Verify("nodot", ctx, now)))
	})
}

func TestParseKeys(t *testing.T) {
	secret := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	k, err := policy.ParseKeys("k1:" + secret + ", k2:" + secret)
	require.NoError(t, err)
	assert.Len(t, k, 2)
	for _, bad := range []string{"k1", "k1:!!!", "k1:" + base64.StdEncoding.EncodeToString([]byte("short")), "k.1:" + secret,
		"k 1:" + secret, secret, "k1 " + secret} {
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
