package cli_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/cli"
)

// waitFor waits until w's output matches pattern and returns the match.
func waitFor(t *testing.T, w *syncWriter, pattern *regexp.Regexp) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if m := pattern.FindStringSubmatch(w.String()); m != nil {
			return m
		}
		select {
		case <-w.signal():
		case <-deadline:
			t.Fatalf("no %s in:\n%s", pattern, w.String())
		}
	}
}

func get(t *testing.T, method, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{"prompt": "hi"}`))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

// TestDevAndConsoleServeTheConsole: dev prints the console's address with
// a token of its own; `console token` makes a token, and `console` serves
// the API to it, with its roles.
func TestDevAndConsoleServeTheConsole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	devCtx, stopDev := context.WithCancel(ctx)
	defer stopDev()
	var devOut syncWriter
	devDone := make(chan int, 1)
	go func() {
		devDone <- cli.Execute(devCtx, []string{"dev", "--port", "-1", "--store", t.TempDir(), "--no-demo", "--console", "127.0.0.1:0"}, nil, &devOut, &devOut)
	}()
	natsURL := waitForURL(t, &devOut)
	m := waitFor(t, &devOut, regexp.MustCompile(`console: (http://127\.0\.0\.1:\d+/)#token=(\S+)`))
	assert.Equal(t, http.StatusOK, get(t, http.MethodGet, m[1]+"v1/catalog", m[2]))
	assert.Equal(t, http.StatusUnauthorized, get(t, http.MethodGet, m[1]+"v1/catalog", ""))
	assert.Equal(t, http.StatusOK, get(t, http.MethodGet, m[1], ""), "the page")

	var out, errOut bytes.Buffer
	require.Equal(t, 0, cli.Execute(ctx, []string{"console", "token", "--user", "alice", "--roles", "read"}, nil, &out, &errOut), errOut.String())
	tok := regexp.MustCompile(`token: (\S+)\nentry: (\{.*\})`).FindStringSubmatch(out.String())
	require.NotNil(t, tok, out.String())
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(tokens, []byte(`{"tokens": [`+tok[2]+`]}`), 0o600))

	assert.Equal(t, 1, cli.Execute(ctx, []string{"--nats", natsURL, "console", "--tokens", tokens, "--listen", "0.0.0.0:0"}, nil, &out, &errOut))
	assert.Contains(t, errOut.String(), "not a loopback address")

	conCtx, stopConsole := context.WithCancel(ctx)
	defer stopConsole()
	var conOut syncWriter
	conDone := make(chan int, 1)
	go func() {
		conDone <- cli.Execute(conCtx, []string{"--nats", natsURL, "console", "--tokens", tokens, "--listen", "127.0.0.1:0"}, nil, &conOut, &conOut)
	}()
	c := waitFor(t, &conOut, regexp.MustCompile(`actionbus console: (http://127\.0\.0\.1:\d+/)`))
	assert.Equal(t, http.StatusOK, get(t, http.MethodGet, c[1]+"v1/runs", tok[1]))
	assert.Equal(t, http.StatusForbidden, get(t, http.MethodPost, c[1]+"v1/runs", tok[1]), "a reader's token starts nothing")
	stopConsole()
	assert.Equal(t, 0, <-conDone, conOut.String())
	stopDev()
	assert.Equal(t, 0, <-devDone)
}
