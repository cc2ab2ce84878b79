package process

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/stack"
)

// clusterNode is one nats-server process of the test cluster.
type clusterNode struct {
	name, conf, url string
	cmd             *exec.Cmd
	out             *actionbustest.LogBuffer
}

func (n *clusterNode) start(t *testing.T, bin string) {
	t.Helper()
	n.out = &actionbustest.LogBuffer{}
	n.cmd = exec.Command(bin, "-c", n.conf)
	n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
	require.NoError(t, n.cmd.Start())
}

func (n *clusterNode) kill() {
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Wait()
}

// startCluster builds nats-server from the module cache and starts the
// repo's three-node configuration (deploy/nats/n1..n3.conf with
// accounts.conf) on loopback ports, with stores in a temporary directory.
func startCluster(t *testing.T) []*clusterNode {
	t.Helper()
	dir := t.TempDir()
	bin := buildNATSServer(t, dir) // restarts find it beside the configurations
	accounts, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "accounts.conf"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "accounts.conf"), accounts, 0o600))
	for _, u := range append(natsconf.Users, natsconf.TenantUserNames(natsconf.ExampleTenants...)...) {
		t.Setenv(natsconf.PasswordVar(u), "pw-"+u)
	}
	var client, route [3]string
	for i := range 3 {
		client[i], route[i] = freeAddr(t), freeAddr(t)
	}
	var nodes []*clusterNode
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", name+".conf"))
		require.NoError(t, err)
		conf := string(b)
		// Rewrite addresses and paths; everything else is the repo's.
		conf = strings.Replace(conf, "listen: 0.0.0.0:4222", "listen: "+client[i], 1)
		conf = regexp.MustCompile(`(?m)^http: .*$`).ReplaceAllString(conf, "")
		conf = strings.Replace(conf, "store_dir: /data/jetstream", "store_dir: "+filepath.Join(dir, name), 1)
		conf = strings.Replace(conf, "listen: 0.0.0.0:6222", "listen: "+route[i], 1)
		conf = strings.Replace(conf, "listen: 0.0.0.0:7422", "listen: "+freeAddr(t), 1)
		for j := range 3 {
			conf = strings.Replace(conf, fmt.Sprintf("nats-route://n%d:6222", j+1), "nats-route://"+route[j], 1)
		}
		require.Contains(t, conf, "sync_interval: always")
		path := filepath.Join(dir, name+".conf")
		require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
		n := &clusterNode{name: name, conf: path, url: "nats://admin:pw-admin@" + client[i]}
		n.start(t, bin)
		t.Cleanup(func() {
			n.kill()
			if t.Failed() {
				t.Logf("%s output:\n%s", n.name, n.out.String())
			}
		})
		nodes = append(nodes, n)
	}
	return nodes
}

// TestAThreeNodeClusterLosesANodeMidLoadAndEveryRunEndsOnce runs 200 runs
// through the services on a real three-node cluster provisioned with
// replicas 3, SIGKILLs one node in the middle, checks that every run
// reaches exactly one terminal state, then restarts the node and waits
// for it to catch up.
func TestAThreeNodeClusterLosesANodeMidLoadAndEveryRunEndsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	nodes := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	urls := nodes[0].url + "," + nodes[1].url + "," + nodes[2].url
	connect := func() *nats.Conn {
		nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true),
			nats.DisconnectErrHandler(func(nc *nats.Conn, err error) { t.Logf("%s disconnected: %v", time.Now().Format("15:04:05.000"), err) }),
			nats.ReconnectHandler(func(nc *nats.Conn) {
				t.Logf("%s reconnected to %s", time.Now().Format("15:04:05.000"), nc.ConnectedUrlRedacted())
			}))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	admin := connect()
	js, err := jetstream.New(admin)
	require.NoError(t, err)
	// A short ack wait: a message whose ack was lost with the node is
	// redelivered in seconds, not minutes. But MaxDeliver (5) ack waits
	// must outlast the failover: work delivered to pulls parked on the
	// lost node is redelivered each ack wait, and a call whose deliveries
	// all go that way fails delivery_exhausted (at 2 s, a failover of 8 s
	// on a busy 2-core machine did that now and then).
	topo := bus.Topology{Replicas: 3, AckWait: 5 * time.Second}
	// The cluster is ready for provisioning once JetStream answers with a
	// meta leader and all three servers.
	require.Eventually(t, func() bool {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		defer acancel()
		_, err := js.AccountInfo(actx)
		return err == nil
	}, 60*time.Second, 100*time.Millisecond, "the cluster elects a meta leader")
	pctx, pcancel := context.WithTimeout(ctx, 60*time.Second)
	defer pcancel()
	require.NoError(t, topo.Provision(pctx, js), "provision with replicas 3")
	info, err := js.Stream(ctx, topo.StreamRuns())
	require.NoError(t, err)
	require.Equal(t, 3, info.CachedInfo().Config.Replicas)

	script, err := planner.NewScript(map[string]planner.Scenario{"echo": {Decisions: []events.Decision{
		{Type: events.DecisionAction, Name: "t.echo", Args: map[string]any{"v": "{{ .Prompt }}"}},
		{Type: events.DecisionFinal, Answer: `{{ index .Results "t.echo" "v" }}`},
	}}})
	require.NoError(t, err)
	logs := &actionbustest.LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service logs (warnings and errors):\n%s", linesWith(logs.String(), "level=WARN", "level=ERROR"))
		}
	})
	st, err := stack.Start(ctx, connect(), stack.Config{Provider: script, Executors: 2, Slots: 16,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "t.echo"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: in}, nil
			})
		}})
	require.NoError(t, err)
	defer st.Stop()
	c, err := client.New(connect(), client.Options{})
	require.NoError(t, err)

	const runs = 200
	ids := make([]string, runs)
	var ended atomic.Int32
	var wg sync.WaitGroup
	results := make([]*client.Result, runs)
	errs := make([]error, runs)
	killed := make(chan struct{})
	for i := range runs {
		if i == runs/2 {
			// Half the runs started, some ended: kill a node mid-load.
			require.Eventually(t, func() bool { return ended.Load() >= 20 }, 60*time.Second, 10*time.Millisecond)
			nodes[1].kill()
			close(killed)
		}
		id, err := c.Start(ctx, client.RunRequest{Prompt: fmt.Sprintf("run-%d", i), Scenario: "echo"})
		require.NoError(t, err, "run %d not accepted", i)
		ids[i] = id
		wg.Add(1)
		go func() {
			defer wg.Done()
			wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
			defer wcancel()
			results[i], errs[i] = c.Wait(wctx, id)
			ended.Add(1)
		}()
	}
	<-killed
	wg.Wait()
	if slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		// Where the in-process services are blocked.
		var buf bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
		for _, g := range strings.Split(buf.String(), "\n\n") {
			if strings.Contains(g, "internal/dispatch.") && !strings.Contains(g, "[select, ") || strings.Contains(g, "dispatch.(*Dispatcher).applyBatch") {
				t.Logf("goroutine:\n%s", g)
			}
		}
		for _, stream := range []string{topo.StreamRuns(), topo.StreamRequests(), topo.StreamTimers()} {
			dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
			if str, err := js.Stream(dctx, stream); err == nil {
				for in := range str.ListConsumers(dctx).Info() {
					leader := ""
					if in.Cluster != nil {
						leader = in.Cluster.Leader
					}
					t.Logf("consumer %s > %s: delivered %d, ack floor %d, pending %d, ack pending %d, redelivered %d, waiting %d, leader %s",
						stream, in.Name, in.Delivered.Stream, in.AckFloor.Stream, in.NumPending, in.NumAckPending, in.NumRedelivered, in.NumWaiting, leader)
				}
			}
			dcancel()
		}
	}
	failedRuns := map[string]int{}
	for i := range runs {
		if errs[i] == nil && results[i] != nil && results[i].Status != client.StatusCompleted {
			failedRuns[ids[i]] = i
		}
	}
	if len(failedRuns) > 0 {
		// Where the work of the failed runs went: is it stored, and what
		// does the pool's consumer say?
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		if ci, err := js.Consumer(dctx, topo.StreamWork(), bus.PoolConsumer("default")); err == nil {
			in := ci.CachedInfo()
			t.Logf("pool consumer: delivered %+v, ack floor %+v, pending %d, ack pending %d, redelivered %d, waiting %d, cluster %+v",
				in.Delivered, in.AckFloor, in.NumPending, in.NumAckPending, in.NumRedelivered, in.NumWaiting, in.Cluster)
		}
		if cons, err := js.OrderedConsumer(dctx, topo.StreamWork(), jetstream.OrderedConsumerConfig{}); err == nil {
			for {
				batch, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
				if err != nil {
					break
				}
				n := 0
				for m := range batch.Messages() {
					n++
					if i, ok := failedRuns[m.Headers().Get("ce-runid")]; ok {
						md, _ := m.Metadata()
						t.Logf("run %d: work stored at seq %d, %s", i, md.Sequence.Stream, md.Timestamp.Format("15:04:05.000"))
					}
				}
				if n == 0 {
					break
				}
			}
		}
		dcancel()
	}
	for i := range runs {
		if errs[i] != nil {
			// Show where the run stands before failing.
			cons, err := js.OrderedConsumer(context.Background(), topo.StreamRuns(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ab.run.default." + ids[i] + ".>"}})
			if err == nil {
				batch, _ := cons.Fetch(200, jetstream.FetchMaxWait(2*time.Second))
				if batch != nil {
					for m := range batch.Messages() {
						t.Logf("run %d: %s %s", i, m.Subject(), m.Headers().Get("ce-type"))
					}
				}
			}
			// What each stream stores of the run (per-subject counts, one
			// API call per stream: no consumer to create).
			for _, name := range []string{topo.StreamRequests(), topo.StreamRuns(), topo.StreamWork(), topo.StreamTimers()} {
				sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
				if str, err := js.Stream(sctx, name); err == nil {
					if info, err := str.Info(sctx, jetstream.WithSubjectFilter(">")); err == nil {
						for subj, n := range info.State.Subjects {
							if strings.Contains(subj, ids[i]) {
								t.Logf("run %d: %s stores %d on %s", i, name, n, subj)
							}
						}
					} else {
						t.Logf("run %d: %s: %v", i, name, err)
					}
				}
				scancel()
			}
			t.Logf("run %d: the services' log of it:\n%s", i, linesWith(logs.String(), ids[i]))
			entry, err := js.KeyValue(context.Background(), topo.BucketRuns())
			if err == nil {
				if e, err := entry.Get(context.Background(), ids[i]); err == nil {
					t.Logf("run %d state: %s", i, e.Value())
				}
			}
		}
		require.NoError(t, errs[i], "run %d", i)
		if results[i].Status != client.StatusCompleted {
			if str, err := js.Stream(context.Background(), "AB_RUNS"); err == nil {
				cons, _ := str.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ab.run.default." + ids[i] + ".>"}})
				batch, _ := cons.FetchNoWait(100)
				for m := range batch.Messages() {
					t.Logf("run %d stored: %s %s %s", i, m.Subject(), m.Headers().Get("ce-type"), string(m.Data()))
				}
			}
		}
		assert.Equal(t, client.StatusCompleted, results[i].Status, "run %d: %+v", i, results[i].Error)
		assert.Equal(t, fmt.Sprintf("run-%d", i), results[i].Answer)
	}

	// Exactly one terminal event per run in the stream. JetStream API
	// requests get short deadlines and are retried: right after a node
	// loss a request may go unanswered while leaders are elected.
	terminals := map[string]int{}
	require.Eventually(t, func() bool {
		clear(terminals)
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		cons, err := js.OrderedConsumer(rctx, topo.StreamRuns(), jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"ab.run.*.*.completed.*", "ab.run.*.*.failed.*", "ab.run.*.*.canceled.*"}})
		if err != nil {
			return false
		}
		for {
			batch, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return false
			}
			n := 0
			for m := range batch.Messages() {
				n++
				terminals[strings.Split(m.Subject(), ".")[3]]++ // ab.run.<tenant>.<runId>.<verb>.<partition>
			}
			if n == 0 {
				return len(terminals) >= runs
			}
		}
	}, 60*time.Second, 500*time.Millisecond, "read every terminal event")
	require.Len(t, terminals, runs)
	for _, id := range ids {
		assert.Equal(t, 1, terminals[id], "run %s has exactly one terminal event", id)
	}

	// The killed node comes back and catches up: every replica current.
	nodes[1].start(t, filepath.Join(filepath.Dir(nodes[1].conf), "nats-server"))
	for _, name := range []string{topo.StreamRuns(), topo.StreamWork(), topo.StreamAudit(), "KV_ab_runs"} {
		require.Eventually(t, func() bool {
			sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
			defer scancel()
			s, err := js.Stream(sctx, name)
			if err != nil {
				return false
			}
			ci := s.CachedInfo().Cluster
			if ci == nil || ci.Leader == "" || len(ci.Replicas) != 2 {
				return false
			}
			for _, r := range ci.Replicas {
				if !r.Current || r.Offline || r.Lag > 0 {
					return false
				}
			}
			return true
		}, 60*time.Second, 200*time.Millisecond, "stream %s caught up on the restarted node", name)
	}
}

// linesWith returns the lines of s that contain any of subs.
func linesWith(s string, subs ...string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if slices.ContainsFunc(subs, func(sub string) bool { return strings.Contains(line, sub) }) {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
