package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/stack"
)

// memoryInFlight measures the dispatcher, as its own process, holding n
// runs in flight: every run's action waits (one executor slot that never
// finishes), so each run stays in the dispatcher's state. It returns the
// dispatcher's resident memory in MiB and its top in-use heap entries.
func memoryInFlight(ctx context.Context, n int) (float64, string, error) {
	dir, err := os.MkdirTemp("", "actionbus-bench-mem-")
	if err != nil {
		return 0, "", err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "dispatcher")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/dispatcher").CombinedOutput(); err != nil {
		return 0, "", fmt.Errorf("build dispatcher: %v: %s", err, out)
	}
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: filepath.Join(dir, "js")})
	if err != nil {
		return 0, "", err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return 0, "", err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := (bus.Topology{}).Provision(ctx, js); err != nil {
		return 0, "", err
	}
	script, _ := planner.NewScript(nil)
	hold := make(chan struct{})
	defer close(hold)
	st, err := stack.Start(ctx, nc, stack.Config{Provider: script, NoDispatcher: true, NoAuditor: true, Slots: 1,
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "bench.wait", Timeout: time.Hour},
				func(ctx context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
					select {
					case <-hold:
					case <-ctx.Done():
					}
					return executor.Result[map[string]any]{Output: in}, nil
				})
		}})
	if err != nil {
		return 0, "", err
	}
	defer st.Stop()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, "", err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "NATS_URL="+ns.ClientURL(), "ACTIONBUS_DEBUG_ADDR="+addr, "ACTIONBUS_RUN_DEADLINE=2h")
	if err := cmd.Start(); err != nil {
		return 0, "", err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	c, err := client.New(nc, client.Options{})
	if err != nil {
		return 0, "", err
	}
	for i := 0; i < n; i++ {
		if _, err := c.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "bench.wait", Args: map[string]any{"i": i}}}); err != nil {
			return 0, "", err
		}
	}
	// In flight: every run.requested handled, every run waiting on its action.
	cons, err := js.Consumer(ctx, "AB_REQUESTS", bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0))
	if err != nil {
		return 0, "", err
	}
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	rss, err := residentMiB(cmd.Process.Pid)
	if err != nil {
		return 0, "", err
	}
	top, err := heapTop(ctx, "http://"+addr+"/debug/pprof/heap", dir)
	return rss, top, err
}

func residentMiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// heapTop returns the top in-use heap entries of a pprof heap profile.
func heapTop(ctx context.Context, url, dir string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	path := filepath.Join(dir, "heap.pb.gz")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		return "", err
	}
	f.Close()
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=8", "-sample_index=inuse_space", path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pprof: %v: %s", err, out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "%") && !strings.HasPrefix(strings.TrimSpace(l), "Showing") {
			lines = append(lines, "    "+strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n"), nil
}
