package builtin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/builtin"
)

func TestBuiltinsRunOnExecutors(t *testing.T) {
	pages := pageServer(t)
	searx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "json", r.URL.Query().Get("format"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"query":%q,"results":[{"title":"JetStream","url":"%s/article","content":"persistence"},{"title":"No URL"},{"title":"Data","url":"%s/data.json"},{"title":"Third","url":"https://example.org/3"}]}`,
			r.URL.Query().Get("q"), pages.URL, pages.URL)
	}))
	t.Cleanup(searx.Close)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		m, err := builtin.Register(ex, builtin.Config{Net: allowLoopback(), SearchEndpoint: searx.URL + "/search", WorkspaceRoot: t.TempDir()})
		if err == nil {
			t.Cleanup(func() { m.Close() })
		}
		return err
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "web_search", Args: map[string]any{"query": "jetstream", "limit": 2}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	out := res.Output.(map[string]any)
	assert.Equal(t, "web_search_result", out["kind"])
	hits := out["results"].([]any)
	require.Len(t, hits, 2)
	assert.Equal(t, pages.URL+"/article", hits[0].(map[string]any)["url"])

	res, err = st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "read_url", Args: map[string]any{"url": pages.URL + "/article"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	page := res.Output.(map[string]any)
	assert.Equal(t, true, page["ok"])
	assert.Equal(t, "NATS JetStream explained", page["title"])
	assert.Equal(t, "NATS JetStream explained", res.Answer, "the summary is the title")

	// A refused address is a read_url_result with ok false, not a crash.
	res, err = st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "read_url", Args: map[string]any{"url": "http://169.254.169.254/"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	assert.Equal(t, builtin.ReasonAddressRefused, res.Output.(map[string]any)["reason"])

	// Workspace mutations are mutate mode: refused without allowance.
	res, err = st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "write_file", Args: map[string]any{"path": "a.txt", "content": "x"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, "mode_not_allowed", string(res.Error.Code))

	acts, err := st.Client.Actions(ctx)
	require.NoError(t, err)
	modes := map[string]string{}
	for _, a := range acts {
		modes[a.Name] = a.Mode
	}
	assert.Equal(t, map[string]string{"read_url": "read", "web_search": "read", "read_file": "read", "glob_files": "read", "grep_files": "read",
		"edit_file": "mutate", "apply_patch": "mutate", "write_file": "mutate"}, modes)
}
