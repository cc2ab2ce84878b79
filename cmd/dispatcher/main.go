// Command dispatcher runs the actionbus dispatcher service.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	var c service.Common
	var cfg dispatch.Config
	c.Flags(flag.CommandLine)
	maxPlan := flag.String("max-plan-actions", service.Env("ACTIONBUS_MAX_PLAN_ACTIONS", strconv.Itoa(events.DefaultMaxPlanActions)), "actions per plan, 1 to 20 (env ACTIONBUS_MAX_PLAN_ACTIONS)")
	flag.IntVar(&cfg.MaxCycles, "max-cycles", service.EnvInt("ACTIONBUS_MAX_CYCLES", events.DefaultMaxCycles), "planner cycles per run (env ACTIONBUS_MAX_CYCLES)")
	flag.IntVar(&cfg.MaxPlanParallel, "max-plan-parallel", service.EnvInt("ACTIONBUS_MAX_PLAN_PARALLEL", events.DefaultMaxPlanParallel), "plan actions in flight (env ACTIONBUS_MAX_PLAN_PARALLEL)")
	flag.IntVar(&cfg.MaxFailedRounds, "max-failed-rounds", service.EnvInt("ACTIONBUS_MAX_FAILED_ROUNDS", events.DefaultMaxFailedRounds), "consecutive failed rounds of one action before the loop stops (env ACTIONBUS_MAX_FAILED_ROUNDS)")
	flag.IntVar(&cfg.Concurrency, "concurrency", service.EnvInt("ACTIONBUS_CONCURRENCY", dispatch.DefaultConcurrency), "events handled at once (env ACTIONBUS_CONCURRENCY)")
	flag.DurationVar(&cfg.RunDeadline, "run-deadline", service.EnvDuration("ACTIONBUS_RUN_DEADLINE", events.DefaultRunDeadline), "default whole-run deadline (env ACTIONBUS_RUN_DEADLINE)")
	flag.DurationVar(&cfg.DecisionTimeout, "decision-timeout", service.EnvDuration("ACTIONBUS_DECISION_TIMEOUT", events.DefaultDecisionTimeout), "planner decision deadline (env ACTIONBUS_DECISION_TIMEOUT)")
	flag.DurationVar(&cfg.ResultLinger, "result-linger", service.EnvDuration("ACTIONBUS_RESULT_LINGER", dispatch.DefaultResultLinger), "longest hold of results and decisions whose transitions need no write of their own (a plan's results, a chain's next step), for the run's next write or its end; negative writes each at once (env ACTIONBUS_RESULT_LINGER)")
	flag.DurationVar(&cfg.AlarmDelay, "alarm-delay", service.EnvDuration("ACTIONBUS_ALARM_DELAY", dispatch.DefaultAlarmDelay), "how long a new run's alarm is held before it is armed (a run that ends sooner stores none); negative arms at once (env ACTIONBUS_ALARM_DELAY)")
	runBudget := flag.String("run-budget", service.Env("ACTIONBUS_RUN_BUDGET", ""), `budget of every agent run's LLM calls, as JSON, e.g. {"maxTokens":200000,"maxCostUsd":0.5}; a request cannot raise it (env ACTIONBUS_RUN_BUDGET; docs/limits.md)`)
	tenantBudgets := flag.String("tenant-budgets", service.Env("ACTIONBUS_TENANT_BUDGETS", ""), `each tenant's LLM budget per UTC day, as JSON, e.g. {"acme":{"maxCostUsd":20},"*":{"maxTokens":5000000}} ("*": every other tenant; env ACTIONBUS_TENANT_BUDGETS; docs/limits.md)`)
	policyFile := flag.String("policy", service.Env("ACTIONBUS_POLICY_FILE", ""), "policy document (JSON); the policy bucket can replace it at run time")
	flag.Parse()
	os.Exit(service.Main("dispatcher", c, func(nc *nats.Conn, log *slog.Logger, m *metrics.Metrics) (service.Runner, error) {
		n, err := dispatch.ParsePlanLimit(*maxPlan)
		if err != nil {
			return nil, err
		}
		if cfg.RunBudget, err = run.ParseBudget(*runBudget); err != nil {
			return nil, fmt.Errorf("--run-budget: %w", err)
		}
		if cfg.TenantBudgets, err = run.ParseTenantBudgets(*tenantBudgets); err != nil {
			return nil, fmt.Errorf("--tenant-budgets: %w", err)
		}
		if cfg.ApprovalKeys, err = policy.ParseKeys(os.Getenv("ACTIONBUS_APPROVAL_KEYS")); err != nil {
			return nil, err
		}
		if *policyFile != "" {
			b, err := os.ReadFile(*policyFile)
			if err != nil {
				return nil, err
			}
			if cfg.Policy, err = policy.ParseConfig(b); err != nil {
				return nil, err
			}
		}
		cfg.Prefix, cfg.Logger, cfg.MaxPlanActions, cfg.InstanceID, cfg.Metrics = c.Prefix, log, n, os.Getenv("ACTIONBUS_INSTANCE"), m
		return dispatch.New(nc, cfg)
	}))
}
