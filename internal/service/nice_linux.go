package service

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// setNice gives every thread of the process the scheduling niceness n.
// Linux keeps niceness per thread, and a new thread takes its creator's:
// once every thread has n, so has every thread the runtime starts later.
// A thread started while the list is walked is caught by the next pass.
func setNice(n int) error {
	for pass := 0; pass < 10; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		changed := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			// getpriority's raw value is 20 - nice.
			if p, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil && 20-p == n {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("set niceness %d: %w", n, err)
			}
			changed = true
		}
		if !changed {
			return nil
		}
	}
	return nil
}
