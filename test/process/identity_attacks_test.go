package process

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/policy"
)

// Identity attacks against the real binaries, as the deployed client and
// approver users: the role a policy requires, written into a run's
// metadata or signed into a principal with an approver's own key, grants
// nothing; a grant that names someone other than its key's holder is
// refused, and the accepted grant's answer and audit name the holder.
func TestIdentityAttacksAsTheDeployedUsers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts service processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := deployed(t)
	// k1 is held by alice (deployed above as plain k1; the dispatcher
	// reads its keys when it starts).
	t.Setenv("ACTIONBUS_APPROVAL_KEYS", "k1:"+base64.StdEncoding.EncodeToString(deployApprovalKey)+":alice")
	bin := buildServices(t)
	policyFile := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(policyFile, []byte(`{"requireRoles": {"delivery.getJob": "finance"}}`), 0o600))
	startService(t, filepath.Join(bin, "dispatcher"), srv.UserURL("dispatcher"), "--policy", policyFile)
	startService(t, filepath.Join(bin, "executor"), srv.UserURL("executor"), "--id", "ex-1")
	startService(t, filepath.Join(bin, "auditor"), srv.UserURL("auditor"))

	clientNC, _ := connectAs(t, srv.UserURL("client"), "_INBOX_default")
	c, err := client.New(clientNC, client.Options{})
	require.NoError(t, err)
	approverNC, _ := connectAs(t, srv.UserURL("approver"), "_INBOX_default")
	approver, err := client.New(approverNC, client.Options{})
	require.NoError(t, err)
	waitCatalog(t, ctx, c, "delivery.getJob")

	getJob := &client.ActionCall{Name: "delivery.getJob", Args: map[string]any{"jobId": "job_1041"}}
	t.Run("roles written into metadata", func(t *testing.T) {
		res, err := c.Run(ctx, client.RunRequest{Action: getJob, Metadata: map[string]any{"roles": "finance", "scopes": []any{"finance"}}}, nil)
		require.NoError(t, err)
		require.NotNil(t, res.Error, "a role the client wrote granted the action")
		assert.Equal(t, actionbus.CodePolicyRejected, res.Error.Code)
	})
	t.Run("a principal signed with an approver's own key", func(t *testing.T) {
		res, err := c.Run(ctx, client.RunRequest{Action: getJob,
			Principal: &client.Principal{User: "cfo", Roles: []string{"finance"}, KeyID: "k1", Key: deployApprovalKey}}, nil)
		require.NoError(t, err)
		require.NotNil(t, res.Error, "a self-signed principal granted the action")
		assert.Equal(t, actionbus.CodeUnauthenticated, res.Error.Code)
	})

	t.Run("a grant naming someone other than its key's holder", func(t *testing.T) {
		runID, err := c.Start(ctx, client.RunRequest{AllowedModes: []string{"read", "mutate"},
			Action: &client.ActionCall{Name: "delivery.executeRetry", Args: map[string]any{"jobIds": []any{"job_1041"}, "dryRunHash": strings.Repeat("0", 64)}}})
		require.NoError(t, err)
		var approvalID string
		fctx, cancelFollow := context.WithCancel(ctx)
		defer cancelFollow()
		_, _ = c.Follow(fctx, runID, func(e client.Event) {
			if s, ok := e.Step(); ok && s.Name == "awaiting-approval" && approvalID == "" {
				approvalID, _ = s.Details["approvalId"].(string)
				cancelFollow()
			}
		})
		require.NotEmpty(t, approvalID)
		p, err := approver.Approval(ctx, approvalID)
		require.NoError(t, err)
		token, err := policy.Sign("k1", deployApprovalKey, policy.ApprovalContext(p.Context))
		require.NoError(t, err)
		eb, err := bus.Open(approverNC, bus.BusConfig{Source: "/approver"})
		require.NoError(t, err)
		_, err = eb.Emit(ctx, events.TypeApprovalGranted, events.NewID(), events.DefaultTenant, runID, "",
			&events.ApprovalGranted{RunID: runID, ApprovalID: approvalID, Token: token, Approver: "the-cfo"})
		require.NoError(t, err)

		require.NoError(t, approver.Approve(ctx, approvalID, "k1", deployApprovalKey))
		// (The handler itself then refuses: nothing was dry-run. Who
		// approved is what this test is about.)
		_, err = c.Wait(ctx, runID)
		require.NoError(t, err)
		var answers []string
		require.Eventually(t, func() bool {
			recs, err := c.AuditRecords(ctx, runID)
			if err != nil {
				return false
			}
			answers = nil
			for _, r := range recs {
				if r.Kind == "approval" && (r.Status == "answer_granted" || r.Status == "answer_refused") {
					answers = append(answers, r.Status+" "+r.UserID)
				}
			}
			return len(answers) == 2
		}, 20*time.Second, 50*time.Millisecond, "answers %v", answers)
		assert.Equal(t, []string{"answer_refused the-cfo", "answer_granted alice"}, answers)
	})
}
