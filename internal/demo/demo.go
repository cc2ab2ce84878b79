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
	"sync"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/planner"
)

//go:embed scenarios/*.yaml
var scenarioFS embed.FS

//go:embed skills
var skillFS embed.FS

// Scenarios returns the built-in demo scenarios.
func Scenarios() (map[string]planner.Scenario, error) {
	b, err := scenarioFS.ReadFile("scenarios/delivery.yaml")
	if err != nil {
		return nil, err
	}
	return planner.ParseScenarios(b)
}

// Script is the script planner of the services and `actionbus dev`: the
// built-in demo scenarios plus those of files (scenario files or
// directories; a name in a file replaces a built-in one). It also returns
// how many scenarios it knows.
func Script(files ...string) (*planner.Script, int, error) {
	all, err := Scenarios()
	if err != nil {
		return nil, 0, err
	}
	if len(files) > 0 {
		extra, err := planner.LoadScenarios(files...)
		if err != nil {
			return nil, 0, err
		}
		for k, v := range extra {
			all[k] = v
		}
	}
	s, err := planner.NewScript(all)
	return s, len(all), err
}

// Job is a delivery job of the fake store.
type Job struct {
	JobID     string `json:"jobId"`
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"lastError,omitempty"`
}

// Store is the fake job store the delivery actions share. It is safe for
// concurrent use.
type Store struct {
	mu   sync.Mutex
	jobs map[string]Job
	// applied maps an idempotency key to the result of the retry it made,
	// as a real service's transaction log would.
	applied map[string]ExecuteOut
}

// NewStore returns a store with the demo's four jobs.
func NewStore() *Store {
	return &Store{applied: map[string]ExecuteOut{}, jobs: map[string]Job{
		"job_1041": {JobID: "job_1041", Status: "FAILED", Attempts: 1, LastError: "carrier API timed out"},
		"job_1042": {JobID: "job_1042", Status: "FAILED", Attempts: 5, LastError: "address rejected by carrier"},
		"job_1043": {JobID: "job_1043", Status: "FAILED", Attempts: 2, LastError: "label service returned 503"},
		"job_1044": {JobID: "job_1044", Status: "DELIVERED", Attempts: 1},
	}}
}

// Job returns a job.
func (s *Store) Job(id string) (Job, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	return j, ok
}

func retryable(j Job) bool { return j.Status == "FAILED" && j.Attempts < 5 }

// defaultStore serves executors that bring none.
var defaultStore = NewStore()

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
	// DryRunHash is the stable hash of the dry run's input: an approval of
	// delivery.executeRetry is bound to it.
	DryRunHash string `json:"dryRunHash"`
}

// ExecuteIn is the input of delivery.executeRetry.
type ExecuteIn struct {
	JobIDs []string `json:"jobIds" jsonschema:"minItems=1"`
	// DryRunHash is the hash delivery.dryRunRetry returned for exactly
	// these jobs.
	DryRunHash string `json:"dryRunHash" jsonschema:"minLength=64,maxLength=64"`
}

// ExecuteOut is the output of delivery.executeRetry.
type ExecuteOut struct {
	Retried []string `json:"retried"`
	Skipped []string `json:"skipped"`
}

// EchoIn is the input and output of demo.echo.
type EchoIn struct {
	Message string `json:"message"`
}

// Options tunes the demo actions.
type Options struct {
	// Latency simulates the I/O time of each delivery action.
	Latency time.Duration
	// Store is the job store; nil means the process-wide one. Executors
	// of one demo share a store.
	Store *Store
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
	store := opts.Store
	if store == nil {
		store = defaultStore
	}
	if err := executor.Register(ex, executor.Action{Name: "delivery.searchJobs", Description: "Search delivery jobs by status.", Mode: executor.ModeRead},
		func(ctx context.Context, in SearchIn, _ executor.Call) (executor.Result[SearchOut], error) {
			if err := wait(ctx, opts.Latency); err != nil {
				return executor.Result[SearchOut]{}, err
			}
			out := SearchOut{JobIDs: []string{}}
			store.mu.Lock()
			for id, j := range store.jobs {
				for _, s := range in.Status {
					if j.Status == s {
						out.JobIDs = append(out.JobIDs, id)
					}
				}
			}
			store.mu.Unlock()
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
			j, ok := store.Job(in.JobID)
			if !ok {
				return executor.Result[Job]{}, actionbus.Errorf("job_not_found", "no delivery job %q", in.JobID)
			}
			return executor.Result[Job]{Output: j, Summary: j.JobID + " " + j.Status}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "delivery.dryRunRetry", Description: "Validate retry candidates before mutation.", Mode: executor.ModeDryRun},
		func(ctx context.Context, in RetryIn, call executor.Call) (executor.Result[RetryOut], error) {
			if err := wait(ctx, opts.Latency); err != nil {
				return executor.Result[RetryOut]{}, err
			}
			out := RetryOut{Retryable: []string{}, Blocked: []string{}, DryRunHash: call.InputHash}
			for _, id := range in.JobIDs {
				if j, ok := store.Job(id); ok && retryable(j) {
					out.Retryable = append(out.Retryable, id)
				} else {
					out.Blocked = append(out.Blocked, id)
				}
			}
			return executor.Result[RetryOut]{Output: out, Summary: fmt.Sprintf("%d retryable, %d blocked", len(out.Retryable), len(out.Blocked))}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "delivery.executeRetry", Description: "Retry failed delivery jobs (after a dry run and an approval).",
		Mode: executor.ModeMutate, Tier: 2, ResourceType: "delivery_job", RiskLevel: "medium",
		Planner: &executor.PlannerMeta{Guidance: "Only after delivery.dryRunRetry; pass exactly the jobIds it dry-ran and its dryRunHash (jobs that are not retryable are skipped)."}},
		func(ctx context.Context, in ExecuteIn, call executor.Call) (executor.Result[ExecuteOut], error) {
			if err := checkApproval(call, in); err != nil {
				return executor.Result[ExecuteOut]{}, err
			}
			if err := wait(ctx, opts.Latency); err != nil {
				return executor.Result[ExecuteOut]{}, err
			}
			out := store.retry(call.IdempotencyKey, in.JobIDs)
			return executor.Result[ExecuteOut]{Output: out, Summary: fmt.Sprintf("%d retried, %d skipped", len(out.Retried), len(out.Skipped))}, nil
		}); err != nil {
		return err
	}
	if err := registerSkills(ex, store); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: "demo.echo", Description: "Echo a message back.", Mode: executor.ModeRead},
		func(_ context.Context, in EchoIn, _ executor.Call) (executor.Result[EchoIn], error) {
			return executor.Result[EchoIn]{Output: in, Summary: "echoed"}, nil
		})
}

// registerSkills hosts the demo's two bundled skills: delivery-report
// (count the jobs, draft a report, hand off) and report-review (publish
// the report as the run's answer).
func registerSkills(ex *executor.Executor, store *Store) error {
	report, err := executor.LoadSkill(skillFS, "skills/delivery-report")
	if err != nil {
		return err
	}
	review, err := executor.LoadSkill(skillFS, "skills/report-review")
	if err != nil {
		return err
	}
	err = executor.RegisterSkill(ex, report, map[string]executor.ToolFunc{
		"count_jobs": func(_ context.Context, args map[string]any, _ executor.Call) (map[string]any, error) {
			want := map[string]bool{}
			if list, ok := args["status"].([]any); ok {
				for _, s := range list {
					if str, ok := s.(string); ok {
						want[str] = true
					}
				}
			}
			counts, failed := map[string]any{}, []string{}
			store.mu.Lock()
			for id, j := range store.jobs {
				if len(want) > 0 && !want[j.Status] {
					continue
				}
				n, _ := counts[j.Status].(int)
				counts[j.Status] = n + 1
				if j.Status == "FAILED" {
					failed = append(failed, id)
				}
			}
			store.mu.Unlock()
			sort.Strings(failed)
			return map[string]any{"counts": counts, "failed": failed}, nil
		},
		"draft_report": func(_ context.Context, args map[string]any, _ executor.Call) (map[string]any, error) {
			counts, _ := args["counts"].(map[string]any)
			statuses := make([]string, 0, len(counts))
			for s := range counts {
				statuses = append(statuses, s)
			}
			sort.Strings(statuses)
			md := "# Delivery jobs\n\n| status | jobs |\n|---|---|\n"
			for _, s := range statuses {
				md += fmt.Sprintf("| %s | %v |\n", s, counts[s])
			}
			return map[string]any{"markdown": md}, nil
		},
	})
	if err != nil {
		return err
	}
	return executor.RegisterSkill(ex, review, map[string]executor.ToolFunc{
		"publish_report": func(_ context.Context, args map[string]any, _ executor.Call) (map[string]any, error) {
			md, _ := args["markdown"].(string)
			return map[string]any{"markdown": md + "\nReviewed by report-review.", "resultKind": "final"}, nil
		},
	})
}

// checkApproval re-checks, at the mutation point, that the call carries an
// approval of exactly this input that was given after a dry run with the
// hash the input names: the dispatcher names a dry run in the approval
// context only when its input is this input without dryRunHash.
func checkApproval(call executor.Call, in ExecuteIn) error {
	a := call.Approval
	switch {
	case a == nil:
		return actionbus.Errorf(actionbus.CodeApprovalRequired, "delivery.executeRetry needs an approval")
	case a.Context.InputHash != call.InputHash:
		return actionbus.Errorf(actionbus.CodeApprovalInvalid, "the approval is for another input")
	case time.Now().After(a.Context.ExpiresAt):
		return actionbus.Errorf(actionbus.CodeApprovalExpired, "the approval expired at %s", a.Context.ExpiresAt.Format(time.RFC3339))
	case !a.Context.DryRunMatches || a.Context.DryRunHash != in.DryRunHash:
		return actionbus.Errorf(actionbus.CodeApprovalInvalid, "the approval is not bound to the dry run %s (it names %q); dry-run again and ask for a new approval",
			in.DryRunHash, a.Context.DryRunHash)
	}
	return nil
}

// retry moves retryable jobs to RETRY_QUEUED once per idempotency key.
func (s *Store) retry(key string, ids []string) ExecuteOut {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.applied[key]; ok && key != "" {
		return prev
	}
	out := ExecuteOut{Retried: []string{}, Skipped: []string{}}
	for _, id := range ids {
		j, ok := s.jobs[id]
		if !ok || !retryable(j) {
			out.Skipped = append(out.Skipped, id)
			continue
		}
		j.Status, j.Attempts, j.LastError = "RETRY_QUEUED", j.Attempts+1, ""
		s.jobs[id] = j
		out.Retried = append(out.Retried, id)
	}
	if key != "" {
		s.applied[key] = out
	}
	return out
}
