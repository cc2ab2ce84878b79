// Package attack42_test holds the independent attacks on the LLM budgets
// of issue 42 (security row 93) and the unknown-run rejections of issue
// 39: each test plays a deployed party (an LLM endpoint that lies, a
// tenant's NATS client) on a real embedded nats-server and asserts the
// safe behaviour, so that it fails while the hole it names is open.
package attack42_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/actionbus/actionbus/executor"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// registerReadURL registers read_url, an action that always answers.
func registerReadURL(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "read_url", Description: "Read one public web page."},
		func(_ context.Context, in struct {
			URL string `json:"url"`
		}, _ executor.Call) (executor.Result[string], error) {
			return executor.Result[string]{Output: "NATS is a messaging system.", Summary: "NATS"}, nil
		})
}

// testLogger logs the services' warnings and errors to the test.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
