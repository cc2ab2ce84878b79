package executor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// BenchmarkActionsThroughExecutors measures actions/s end to end (exec
// runs of an echo action, 64 in flight) through one and four executors.
func BenchmarkActionsThroughExecutors(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("executors=%d", n), func(b *testing.B) {
			srv := actionbustest.NewServer(b, actionbustest.Options{})
			st := srv.StartStack(b, actionbustest.StackOptions{Executors: n, Slots: 16, NoAuditor: true, Register: func(ex *executor.Executor) error {
				return executor.Register(ex, executor.Action{Name: "bench.echo"},
					func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
						return executor.Result[map[string]any]{Output: in}, nil
					})
			}})
			ctx := context.Background()
			req := client.RunRequest{Action: &client.ActionCall{Name: "bench.echo", Args: map[string]any{"n": 1}}}
			sem := make(chan struct{}, 64)
			var wg sync.WaitGroup
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					res, err := st.Client.Run(ctx, req, nil)
					if err != nil || res.Status != client.StatusCompleted {
						b.Errorf("run: %v %+v", err, res)
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "actions/s")
		})
	}
}
