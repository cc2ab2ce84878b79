package service

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Every thread of the process is niced, and so is every thread the
// runtime starts afterwards (niceness is per thread on Linux).
func TestNiceReachesEveryThread(t *testing.T) {
	require.NoError(t, setNice(3))
	// Threads started after: goroutines locked to new OS threads.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // this thread exits with the goroutine: a new one is made
			p, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
			assert.NoError(t, err)
			assert.Equal(t, 3, 20-p, "a thread started after inherits the niceness")
		}()
	}
	wg.Wait()
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		if err == nil {
			assert.Equal(t, 3, 20-p, "thread %d", tid)
		}
	}
}
