package client_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

type stepIn struct {
	N int `json:"n"`
}

// TestAFollowerThatLosesLiveMessagesStillDeliversEveryStoredEventOnce: a
// follower that loses every live message of the run's stored events
// (its result, steps and terminal event) reads them from the stream:
// each once, in stored order, and it ends with the result.
func TestAFollowerThatLosesLiveMessagesStillDeliversEveryStoredEventOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.step", Description: "A step."},
			func(_ context.Context, in stepIn, _ executor.Call) (executor.Result[stepIn], error) {
				return executor.Result[stepIn]{Output: in}, nil
			})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, lose := range []string{".completed", ".step", ".result"} {
		t.Run("losing "+lose, func(t *testing.T) {
			c, err := client.New(srv.Connect(t), client.Options{})
			require.NoError(t, err)
			client.LoseLive(c, func(subject string) bool { return strings.HasSuffix(subject, lose) })
			var mu sync.Mutex
			var got []client.Event
			res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.step", Args: map[string]any{"n": 1}}},
				func(e client.Event) { mu.Lock(); got = append(got, e); mu.Unlock() })
			require.NoError(t, err)
			assert.Equal(t, client.StatusCompleted, res.Status)
			// What the stream holds, read by a follower that loses nothing.
			var stored []client.Event
			_, err = st.Client.Follow(ctx, res.RunID, func(e client.Event) {
				if !strings.HasSuffix(e.Subject, ".progress") && !strings.HasSuffix(e.Subject, ".started") {
					stored = append(stored, e)
				}
			})
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			var gotStored []string
			for _, e := range got {
				if !strings.HasSuffix(e.Subject, ".progress") && !strings.HasSuffix(e.Subject, ".started") {
					gotStored = append(gotStored, e.ID)
				}
			}
			var want []string
			for _, e := range stored {
				want = append(want, e.ID)
			}
			require.NotEmpty(t, want)
			assert.Equal(t, want, gotStored, "every stored event once, in stored order")
			assert.Equal(t, res.EventID, got[len(got)-1].ID, "the terminal event last")
		})
	}
}
