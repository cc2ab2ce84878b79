package policy_test

import (
	"context"
	"testing"

	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/policy"
)

func BenchmarkInputHash(b *testing.B) {
	in := map[string]any{"jobIds": []any{"job_1", "job_2", "job_3"}, "reason": "carrier outage", "dryRun": map[string]any{"hash": "abc", "n": 3.0}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := policy.InputHash(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEvaluate(b *testing.B) {
	cfg, err := policy.ParseConfig([]byte(`{"actions": {"ops.restart": "ask"}, "requireRoles": {"billing.refund": "finance"}, "requireScopes": {"*": "actions:run"}}`))
	if err != nil {
		b.Fatal(err)
	}
	ev := &policy.Evaluator{Config: cfg}
	req := policy.Request{Action: "delivery.searchJobs", Mode: actions.ModeRead, Permission: (*actions.Permission)(nil).Normalize(actions.ModeRead),
		Metadata: map[string]any{"scopes": []any{"actions:run"}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_ = ev.Evaluate(ctx, req)
	}
}
