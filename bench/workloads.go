package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// The workloads of BENCHMARKS.md, written once against a system: the
// floor and actionbus each implement it, so both are measured by the same
// code.

// system runs the workloads' units and checks every result against what
// it sent.
type system interface {
	// single runs one action on in and checks its result equals in.
	single(ctx context.Context, in map[string]any) error
	// fanout runs len(ins) independent actions and checks the results
	// come back in declaration order.
	fanout(ctx context.Context, ins []map[string]any) error
	// chain runs n sequential actions, each input bound to the previous
	// output (step incremented), and checks the last output.
	chain(ctx context.Context, in map[string]any, n int) error
}

// input is the workload's action input: about 200 bytes of JSON.
func input(run string, i int) map[string]any {
	m := map[string]any{"run": run, "index": i, "step": 0, "data": ""}
	b, _ := json.Marshal(m)
	m["data"] = strings.Repeat("x", max(0, 200-len(b)))
	return m
}

// same reports whether got, as decoded JSON, equals want.
func same(got, want any) bool {
	a, err1 := json.Marshal(got)
	var w any
	b, _ := json.Marshal(want)
	_ = json.Unmarshal(b, &w)
	c, err2 := json.Marshal(w)
	return err1 == nil && err2 == nil && string(a) == string(c)
}

func mismatch(what string, got, want any) error {
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	return fmt.Errorf("%s: result %s, want %s", what, g, w)
}

// chainStep is step k's expected input when the chain started from in.
func chainStep(in map[string]any, k int) map[string]any {
	out := map[string]any{}
	for key, v := range in {
		out[key] = v
	}
	out["step"] = k
	return out
}

// percentile is the nearest rank: sorted[ceil(p/100·n) − 1].
func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// latencies runs warm-up units (discarded), then n measured ones, one
// after another, and returns each unit's wall-clock time.
func latencies(n, warmup int, unit func(i int) error) ([]time.Duration, error) {
	for i := 0; i < warmup; i++ {
		if err := unit(-1 - i); err != nil {
			return nil, err
		}
	}
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := unit(i); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
}

// closedLoop runs total units with workers in a closed loop (each worker
// takes the next unit when its last one finished) and returns units per
// second from the first start to the last completion.
func closedLoop(total, workers int, unit func(i int) error) (float64, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	t0 := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				if err := unit(i); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total) / time.Since(t0).Seconds(), nil
}

// Workload sizes (BENCHMARKS.md).
const (
	w1Runs, w2Runs, w3Runs, a1Runs = 300, 200, 200, 300
	warmupRuns                     = 30
	w4Runs, w4Workers, w4Warmup    = 2000, 64, 128
	fanoutWidth, chainLength       = 10, 5
)

// w1, w2 and w3 return a workload's unit of work against s (W4 runs W1's
// units), under a run name prefix that keeps repetitions apart.
func w1(ctx context.Context, s system, name string) func(int) error {
	return func(i int) error { return s.single(ctx, input(fmt.Sprintf("%s-%d", name, i), i)) }
}

func w2(ctx context.Context, s system, name string) func(int) error {
	return func(i int) error {
		ins := make([]map[string]any, fanoutWidth)
		for k := range ins {
			ins[k] = input(fmt.Sprintf("%s-%d", name, i), k)
		}
		return s.fanout(ctx, ins)
	}
}

func w3(ctx context.Context, s system, name string) func(int) error {
	return func(i int) error { return s.chain(ctx, input(fmt.Sprintf("%s-%d", name, i), i), chainLength) }
}

// actionbusSystem runs the workloads as actionbus runs through the
// client: W1 a one-action host run, W2 a workflow of 10 independent
// steps, W3 a workflow of 5 steps each bound to the previous output with
// $fromStep.
type actionbusSystem struct{ c *client.Client }

func (a actionbusSystem) run(ctx context.Context, req client.RunRequest) (*client.Result, error) {
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := a.c.Run(rctx, req, nil)
	if err != nil {
		return nil, err
	}
	if res.Status != client.StatusCompleted {
		return nil, fmt.Errorf("run %s %s: %v", res.RunID, res.Status, res.Error)
	}
	return res, nil
}

func (a actionbusSystem) single(ctx context.Context, in map[string]any) error {
	res, err := a.run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "echo", Args: in}})
	if err != nil {
		return err
	}
	if !same(res.Output, in) {
		return mismatch("single", res.Output, in)
	}
	return nil
}

func (a actionbusSystem) fanout(ctx context.Context, ins []map[string]any) error {
	wf := client.NewWorkflow("fanout")
	for k, in := range ins {
		wf.Step(fmt.Sprintf("s%d", k), "echo", in)
	}
	res, err := a.run(ctx, client.RunRequest{Workflow: wf.Build()})
	if err != nil {
		return err
	}
	out, _ := res.Output.(map[string]any)
	byStep, _ := out["outputByStep"].(map[string]any)
	steps, _ := out["steps"].([]any)
	if len(steps) != len(ins) {
		return mismatch("fanout steps", out["steps"], len(ins))
	}
	for k, in := range ins {
		id := fmt.Sprintf("s%d", k)
		if st, _ := steps[k].(map[string]any); st["id"] != id || !same(byStep[id], in) {
			return mismatch("fanout "+id, byStep[id], in)
		}
	}
	return nil
}

func (a actionbusSystem) chain(ctx context.Context, in map[string]any, n int) error {
	wf := client.NewWorkflow("chain").Step("s0", "echo", in)
	for k := 1; k < n; k++ {
		prev := fmt.Sprintf("s%d", k-1)
		wf.Step(fmt.Sprintf("s%d", k), "echo", map[string]any{
			"run": client.FromStep(prev, "/run"), "index": client.FromStep(prev, "/index"),
			"data": client.FromStep(prev, "/data"), "step": k,
		})
	}
	res, err := a.run(ctx, client.RunRequest{Workflow: wf.Build()})
	if err != nil {
		return err
	}
	out, _ := res.Output.(map[string]any)
	byStep, _ := out["outputByStep"].(map[string]any)
	last := fmt.Sprintf("s%d", n-1)
	if want := chainStep(in, n-1); !same(byStep[last], want) {
		return mismatch("chain "+last, byStep[last], want)
	}
	return nil
}

// agentScenario is A1's script: one action, then final.
const agentScenario = `
scenarios:
  a1:
    decisions:
      - {type: action, name: echo, args: {run: a1, index: 0, step: 0, data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx}}
      - {type: final, answer: done}
`

// agent runs A1's unit: an agent run of the script planner.
func (a actionbusSystem) agent(ctx context.Context) error {
	res, err := a.run(ctx, client.RunRequest{Scenario: "a1", Prompt: "echo once"})
	if err != nil {
		return err
	}
	if res.Answer != "done" {
		return fmt.Errorf("agent run %s answered %q", res.RunID, res.Answer)
	}
	return nil
}

// registerEcho registers the workloads' action: echo returns its input.
func registerEcho(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "echo", Description: "returns its input unchanged"},
		func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: in}, nil
		})
}
