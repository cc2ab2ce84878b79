package planner_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/planner"
)

// slowModel answers every decision with a final answer after 100 ms and
// records how many of its calls overlapped.
type slowModel struct{ running, most atomic.Int32 }

func (*slowModel) Name() string  { return "slow" }
func (*slowModel) Model() string { return "m1" }
func (m *slowModel) Decide(ctx context.Context, _ planner.Input) (events.Decision, error) {
	n := m.running.Add(1)
	defer m.running.Add(-1)
	for cur := m.most.Load(); n > cur && !m.most.CompareAndSwap(cur, n); cur = m.most.Load() {
	}
	select {
	case <-time.After(100 * time.Millisecond):
	case <-ctx.Done():
		return events.Decision{}, ctx.Err()
	}
	return events.Decision{Type: events.DecisionFinal, Answer: "ok"}, nil
}
func (*slowModel) Synthesize(context.Context, *events.SynthesisRequested) (string, error) {
	return "", nil
}

// TestTheLLMLimitHoldsAcrossPlanners: two planner instances share one
// model limit of 1 call in flight; six runs asked at once all complete,
// and the model never had two calls at once.
func TestTheLLMLimitHoldsAcrossPlanners(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true})
	model := &slowModel{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		p, err := planner.New(srv.Connect(t), planner.Config{Provider: model, LLMLimit: &limits.Spec{MaxInFlight: 1}})
		require.NoError(t, err)
		go func() { _ = p.Run(ctx) }()
	}
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "hi"}, nil)
			if assert.NoError(t, err) {
				assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int32(1), model.most.Load(), "the model had calls in flight at once")
}
