package executor

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// goroutineID reads the running goroutine's id from its stack header
// ("goroutine 42 [running]:"): for tests only.
func goroutineID(t *testing.T) uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	require.GreaterOrEqual(t, len(f), 2)
	id, err := strconv.ParseUint(string(f[1]), 10, 64)
	require.NoError(t, err)
	return id
}

func TestARunnerThatFinishedACallRunsTheNext(t *testing.T) {
	r := newRunners()
	defer r.stop()
	first := make(chan uint64, 1)
	r.run(func() { first <- goroutineID(t) })
	id := <-first
	// The runner takes the next call once it is idle; a goroutine per
	// call would never show the same id again (ids are not reused).
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := make(chan uint64, 1)
		r.run(func() { got <- goroutineID(t) })
		if <-got == id {
			return
		}
		require.True(t, time.Now().Before(deadline), "no call ran on the runner of the first one")
		runtime.Gosched()
	}
}

func TestRunnersRunEveryCallOnceAndAllAtOnce(t *testing.T) {
	r := newRunners()
	const n = 20
	var mu sync.Mutex
	ran := map[int]int{}
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	started.Add(n)
	finished.Add(n)
	for i := range n {
		r.run(func() {
			mu.Lock()
			ran[i]++
			mu.Unlock()
			started.Done()
			<-release // all n are running together: none waits for another
			finished.Done()
		})
	}
	started.Wait()
	r.stop() // busy runners finish their call
	close(release)
	finished.Wait()
	// After stop a call still runs.
	after := make(chan struct{})
	r.run(func() { close(after) })
	<-after
	require.Len(t, ran, n)
	for i, c := range ran {
		require.Equal(t, 1, c, "call %d", i)
	}
}
