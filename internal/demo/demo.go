// Package demo is the delivery-ops example pack used by `actionbus dev`,
// `make demo`, the default executor and the benchmarks: a few read and
// dryRun actions over an in-memory job store, and script-planner scenarios
// that drive them.
//
// It is an example, not a product feature: its store is fake and resets
// with the process.
package demo

import (
	"context"
	"embed"
	"fmt"
	"sort"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/planner"
)

//go:embed scenarios/*.yaml
var scenarioFS embed.FS

// Scenarios returns the built-in demo scenarios.
func Scenarios() (map[string]planner.Scenario, error) {
	b, err := scenarioFS.ReadFile("scenarios/delivery.yaml")
	if err != nil {
		return nil, err
	}
	return planner.ParseScenarios(b)
}

// Job is a delivery job of the fake store.
type Job struct {
	JobID     string `json:"jobId"`
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"lastError,omitempty"`
}

var jobs = map[string]Job{
	"job_1041": {JobID: "job_1041", Status: "FAILED", Attempts: 1, LastError: "carrier API timed out"},
	"job_1042": {JobID: "job_1042", Status: "FAILED", Attempts: 5, LastError: "address rejected by carrier"},
	"job_1043": {JobID: "job_1043", Status: "FAILED", Attempts: 2, LastError: "label service returned 503"},
	"job_1044": {JobID: "job_1044", Status: "DELIVERED", Attempts: 1},
}

// SearchIn is the input of delivery.searchJobs.
type SearchIn struct {
	Status []string `json:"status" jsonschema:"minItems=1"`
}

// SearchOut is the output of delivery.searchJobs.
type SearchOut struct {
	JobIDs []string `json:"jobIds"`
}

// GetIn is the input of delivery.getJob.
type GetIn struct {
	JobID string `json:"jobId" jsonschema:"minLength=1"`
}

// RetryIn is the input of delivery.dryRunRetry.
type RetryIn struct {
	JobIDs []string `json:"jobIds"`
}

// RetryOut is the output of delivery.dryRunRetry.
type RetryOut struct {
	Retryable []string `json:"retryable"`
	Blocked   []string `json:"blocked"`
}

// EchoIn is the input and output of demo.echo.
type EchoIn struct {
	Message string `json:"message"`
}

// Options tunes the demo actions.
type Options struct {
	// Latency simulates the I/O time of each delivery action.
	Latency time.Duration
}

func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Register registers the demo actions on ex.
func Register(ex *executor.Executor, opts Options) error {
	if err := executor.Register(ex, executor.Action{Name: "delivery.searchJobs", Description: "Search delivery jobs by status.", Mode: executor.ModeRead},
		func(ctx context.Context, in SearchIn, _ executor.Call) (executor.Result[SearchOut], error) {
			if err := wait(ctx, opts.Latency); err != nil {
				return executor.Result[SearchOut]{}, err
			}
			out := SearchOut{JobIDs: []string{}}
			for id, j := range jobs {
				for _, s := range in.Status {
					if j.Status == s {
						out.JobIDs = append(out.JobIDs, id)
					}
				}
			}
			sort.Strings(out.JobIDs)
			return executor.Result[SearchOut]{Output: out, Summary: fmt.Sprintf("%d jobs", len(out.JobIDs))}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "delivery.getJob", Description: "Read one delivery job.", Mode: executor.ModeRead},
		func(ctx context.Context, in GetIn, _ executor.Call) (executor.Result[Job], error) {
			if err := wait(ctx, opts.Latency); err != nil {
				return executor.Result[Job]{}, err
			}
			j, ok := jobs[in.JobID]
			if !ok {
				return executor.Result[Job]{}, actionbus.Errorf("job_not_found", "no delivery job %q", in.JobID)
			}
			return executor.Result[Job]{Output: j, Summary: j.JobID + " " + j.Status}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "delivery.dryRunRetry", Description: "Validate retry candidates before mutation.", Mode: executor.ModeDryRun},
		func(ctx context.Context, in RetryIn, _ executor.Call) (executor.Result[RetryOut], error) {
			if err := wait(ctx, opts.Latency); err != nil {
				return executor.Result[RetryOut]{}, err
			}
			out := RetryOut{Retryable: []string{}, Blocked: []string{}}
			for _, id := range in.JobIDs {
				if j, ok := jobs[id]; ok && j.Status == "FAILED" && j.Attempts < 5 {
					out.Retryable = append(out.Retryable, id)
				} else {
					out.Blocked = append(out.Blocked, id)
				}
			}
			return executor.Result[RetryOut]{Output: out, Summary: fmt.Sprintf("%d retryable, %d blocked", len(out.Retryable), len(out.Blocked))}, nil
		}); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: "demo.echo", Description: "Echo a message back.", Mode: executor.ModeRead},
		func(_ context.Context, in EchoIn, _ executor.Call) (executor.Result[EchoIn], error) {
			return executor.Result[EchoIn]{Output: in, Summary: "echoed"}, nil
		})
}
