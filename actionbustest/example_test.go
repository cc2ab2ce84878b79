package actionbustest_test

import (
	"context"
	"testing"
	"time"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// A test of your own action against a real embedded nats-server with
// JetStream and the four services: register the action, run it, and wait
// on the events it produced (with deadlines, never sleeps).
func Example() {
	// In a _test.go file of your module:
	testGreet := func(t *testing.T) {
		srv := actionbustest.NewServer(t, actionbustest.Options{}) // port -1, a temporary store
		rec := srv.Record(t, "")                                   // every event from now on
		st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
			type in struct {
				Name string `json:"name"`
			}
			return executor.Register(ex, executor.Action{Name: "demo.greet", Description: "Greet someone."},
				func(_ context.Context, x in, _ executor.Call) (executor.Result[in], error) {
					return executor.Result[in]{Output: x, Summary: "hello " + x.Name}, nil
				})
		}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "demo.greet", Args: map[string]any{"name": "ann"}}}, nil)
		if err != nil || res.Status != client.StatusCompleted {
			t.Fatalf("run: %v %+v", err, res)
		}
		// Await returns an error the test words itself.
		if _, err := rec.Await(ctx, func(r actionbustest.Recorded) bool {
			return len(r.AuditRecords()) > 0
		}); err != nil {
			t.Fatalf("the run was not audited: %v", err)
		}
	}
	_ = testGreet
}
