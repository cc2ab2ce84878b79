package builtin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// cgroupRoots says where the shell creates each call's cgroups: pids is
// required (the process bound), memory optional.
type cgroupRoots struct {
	// pids and memory are directories the executor may create cgroups
	// in; memory is empty when no memory controller is at hand.
	pids, memory string
	// v2 reports the unified hierarchy (pids.max, memory.max) rather than
	// v1 (pids.max, memory.limit_in_bytes).
	v2 bool
}

// findCgroups locates where call cgroups go: parent when the host names one
// (a delegated cgroup v2 directory), else the executor's own cgroup in the
// v1 pids (and memory) hierarchies, else its own cgroup v2.
func findCgroups(parent string) (cgroupRoots, error) {
	if parent != "" {
		return cgroupRoots{pids: parent, memory: parent, v2: true}, nil
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupRoots{}, err
	}
	own := parseProcCgroup(string(b))
	// A hierarchy mounted at its root, or at our own cgroup (a cgroup
	// namespace or a container's view): our path below the mount when it
	// exists there, else the mount itself.
	under := func(mount, path string) string {
		if p := filepath.Join(mount, path); dirExists(p) {
			return p
		}
		return mount
	}
	if dirExists("/sys/fs/cgroup/pids") {
		r := cgroupRoots{pids: under("/sys/fs/cgroup/pids", own["pids"])}
		if dirExists("/sys/fs/cgroup/memory") {
			r.memory = under("/sys/fs/cgroup/memory", own["memory"])
		}
		return r, nil
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		p := under("/sys/fs/cgroup", own[""])
		return cgroupRoots{pids: p, memory: p, v2: true}, nil
	}
	return cgroupRoots{}, errors.New("no pids cgroup controller is mounted")
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

var cgroupSeq atomic.Uint64

// cgroupPrefix starts every call cgroup's name, followed by the executor's
// pid and a sequence number.
const cgroupPrefix = "actionbus-shell-"

// removeStale removes call cgroups that an executor which is no longer
// running (killed before it could remove them) left empty.
func (r cgroupRoots) removeStale() {
	for _, root := range []string{r.pids, r.memory} {
		if root == "" {
			continue
		}
		dirs, _ := filepath.Glob(filepath.Join(root, cgroupPrefix+"*"))
		for _, d := range dirs {
			pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), cgroupPrefix), "-")
			if n, err := strconv.Atoi(pid); err == nil && n != os.Getpid() && syscall.Kill(n, 0) == syscall.ESRCH {
				_ = os.Remove(d) // fails, harmlessly, when not empty
			}
		}
	}
}

// callCgroup is one call's cgroups.
type callCgroup struct {
	dirs   []string // created, removed by remove
	events string   // the pids controller's pids.events
	memory bool     // a memory limit applies
}

// newCallCgroup creates the cgroups of one call with at most pids
// processes and memory bytes (the memory bound only where a memory
// controller is at hand).
func newCallCgroup(r cgroupRoots, pids, memory uint64) (*callCgroup, error) {
	name := fmt.Sprintf("%s%d-%d", cgroupPrefix, os.Getpid(), cgroupSeq.Add(1))
	c := &callCgroup{}
	pdir, err := c.make(r.pids, name)
	if err != nil {
		return nil, err
	}
	if err := c.controller(r.pids, pdir, "pids", r.v2); err != nil {
		c.remove()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(pdir, "pids.max"), []byte(strconv.FormatUint(pids, 10)), 0o644); err != nil {
		c.remove()
		return nil, fmt.Errorf("setting pids.max: %w", err)
	}
	c.events = filepath.Join(pdir, "pids.events")
	if r.memory == "" {
		return c, nil
	}
	mdir := pdir
	if r.memory != r.pids {
		if mdir, err = c.make(r.memory, name); err != nil {
			return c, nil // no memory bound here; the per-process one holds
		}
	}
	if c.controller(r.memory, mdir, "memory", r.v2) != nil {
		return c, nil
	}
	file := "memory.limit_in_bytes"
	if r.v2 {
		file = "memory.max"
	}
	if os.WriteFile(filepath.Join(mdir, file), []byte(strconv.FormatUint(memory, 10)), 0o644) == nil {
		c.memory = true
	}
	return c, nil
}

// make creates parent/name.
func (c *callCgroup) make(parent, name string) (string, error) {
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating a cgroup in %s: %w", parent, err)
	}
	c.dirs = append(c.dirs, dir)
	return dir, nil
}

// controller checks that dir has controller's files; on cgroup v2 it
// enables the controller for parent's children first when they lack it.
func (c *callCgroup) controller(parent, dir, controller string, v2 bool) error {
	file := controller + ".max"
	if !v2 && controller == "memory" {
		file = "memory.limit_in_bytes"
	}
	if _, err := os.Stat(filepath.Join(dir, file)); err == nil {
		return nil
	}
	if !v2 {
		return fmt.Errorf("%s has no %s controller", parent, controller)
	}
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+controller), 0o644); err != nil {
		return fmt.Errorf("enabling the %s controller in %s: %w", controller, parent, err)
	}
	if _, err := os.Stat(filepath.Join(dir, file)); err != nil {
		return fmt.Errorf("%s has no %s controller", parent, controller)
	}
	return nil
}

// procs are the cgroup.procs files a process writes itself into to join.
func (c *callCgroup) procs() []string {
	out := make([]string, len(c.dirs))
	for i, d := range c.dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
}

// pidsLimitHit reports whether a fork in the call was refused by its
// process bound.
func (c *callCgroup) pidsLimitHit() bool {
	b, err := os.ReadFile(c.events)
	return err == nil && pidsLimitHit(string(b))
}

// remove kills whatever is left in the call's cgroups (nothing, once its
// PID namespace is gone) and removes them, waiting up to 5 s for the
// kernel to finish tearing the namespace down.
func (c *callCgroup) remove() {
	deadline := time.Now().Add(5 * time.Second)
	for _, d := range slices.Backward(c.dirs) {
		for {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
