package attack38_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/httpapi"
)

// TestAGatewayUserRetriesTheirOwnRunThroughTheAPI: row 87 makes the retry
// of a run a gateway authenticated the gateway's alone (a tenant's NATS
// client naming the user is refused). The gateway the product ships, the
// HTTP API, must then take a retry: POST /v1/runs with retryOf, signed
// for the token's user. (It refused retryOf as an unknown field, so no
// failed run of a gateway user could be retried by anyone.)
func TestAGatewayUserRetriesTheirOwnRunThroughTheAPI(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	srv.StartStack(t, actionbustest.StackOptions{ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(key) + ":*",
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "inv.sync", Description: "Sync the inventory."},
				func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
					return executor.Result[string]{}, errors.New("upstream down")
				})
		}})
	nc := srv.TenantConnect(t, "client", "default")
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	tok, entry, err := httpapi.NewToken("ada", httpapi.RoleRun)
	require.NoError(t, err)
	s, err := httpapi.New(httpapi.Config{Client: c, ApprovalKeyID: "k1", ApprovalKey: key,
		Tokens: httpapi.Tokens{Tokens: []httpapi.Token{entry}}, MaxWait: 20 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	post := func(body map[string]any) (int, map[string]any) {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/v1/runs?wait=20s", bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		var out map[string]any
		require.NoError(t, json.Unmarshal(data, &out), "%s", data)
		return res.StatusCode, out
	}
	call := map[string]any{"name": "inv.sync", "args": map[string]any{}}
	_, first := post(map[string]any{"action": call})
	require.Equal(t, client.StatusFailed, first["status"], "%v", first)
	runID, _ := first["runId"].(string)
	require.NotEmpty(t, runID)

	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	forged, err := c.Run(rctx, client.RunRequest{UserID: "ada", RetryOf: runID, Action: &client.ActionCall{Name: "inv.sync", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.NotNil(t, forged.Error)
	assert.Equal(t, actionbus.CodeRetryRefused, forged.Error.Code, "the tenant's NATS client is refused")

	status, own := post(map[string]any{"action": call, "retryOf": runID})
	assert.NotEqual(t, http.StatusBadRequest, status, "the gateway takes the user's retry: %v", own)
	if e, ok := own["error"].(map[string]any); ok {
		assert.NotContains(t, []any{string(actionbus.CodeBadRequest), string(actionbus.CodeRetryRefused)}, e["code"], "%v", own)
	}
}
