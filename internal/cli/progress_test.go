package cli_test

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/cli"
)

// TestRunPrintsEveryStepOfEachProgressMessageInOrder: `actionbus run`
// prints one line per step, in order, although each transition's live
// steps crossed the server as one run.progress message.
func TestRunPrintsEveryStepOfEachProgressMessageInOrder(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{Scenarios: `
scenarios:
  echo:
    decisions:
      - {type: action, name: t.echo, args: {msg: hi}}
      - {type: final, answer: done}
`, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "t.echo", Description: "Echo."},
			func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: in, Summary: "echoed"}, nil
			})
	}})
	rec := srv.Record(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "run", "--scenario", "echo", "hi"}, nil, &out, &errOut), out.String()+errOut.String())

	// The steps the server carried, message by message (each before the
	// run's end, which the recorder has once it is recorded).
	runID := regexp.MustCompile(`▶ run (\S+) started`).FindStringSubmatch(out.String())[1]
	rec.WaitForType(t, 0, events.TypeRunCompleted, runID)
	var carried []string
	several := false
	for _, r := range rec.All() {
		if r.Type() != events.TypeRunProgress {
			continue
		}
		var p events.RunProgress
		require.NoError(t, events.DataAs(r.Event, &p))
		several = several || len(p.Steps) > 1
		for _, s := range p.Steps {
			carried = append(carried, s.Name)
		}
	}
	require.True(t, several, "a message carried several steps")
	// The step lines printed, in order (this run records no run.step).
	var printed []string
	for _, m := range regexp.MustCompile(`(?m)^ *\S+ [·✓✗] cycle \d+ (\S+)`).FindAllStringSubmatch(out.String(), -1) {
		printed = append(printed, m[1])
	}
	assert.Equal(t, carried, printed, "every step printed, in order:\n%s", out.String())
}
