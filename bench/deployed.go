package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/client"
	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/service"
)

// The deployed topology of BENCHMARKS.md: one nats-server process with
// JetStream (file storage, the server's default sync, or fsync per write
// with -sync always) and the repository's
// accounts, `actionbus provision`, the dispatcher, planner and auditor each
// as its own process, two executor processes hosting `echo`, and the
// client in this process. Every process connects as its deployed user.

// proc is one child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
}

func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// deployment is the running topology.
type deployment struct {
	dir      string
	addr     string // host:port of the nats-server
	server   *proc
	services []*proc
	auditor  *proc
	// auditorBin restarts the auditor (startAuditor).
	auditorBin string
	nc         *nats.Conn // the client user
	admin      *nats.Conn
	adminJS    jetstream.JetStream
	c          *client.Client
	debug      map[string]string // service -> pprof address
	monitor    string            // host:port of the server's monitoring endpoint
}

// url is the server's URL with user's credentials.
func (d *deployment) url(user string) string {
	return fmt.Sprintf("nats://%s:pw-%s@%s", user, user, d.addr)
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	defer l.Close()
	return l.Addr().String()
}

// buildBinaries compiles nats-server and the services into dir.
func buildBinaries(dir string) {
	for _, args := range [][]string{
		{"build", "-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"},
		{"build", "-o", dir + string(os.PathSeparator), "./cmd/actionbus", "./cmd/dispatcher", "./cmd/planner", "./cmd/auditor"},
	} {
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			must(fmt.Errorf("go %s: %v: %s", strings.Join(args, " "), err, out))
		}
	}
}

func (d *deployment) spawn(name, bin, user string, extraEnv []string, args ...string) *proc {
	cmd := exec.Command(bin, args...)
	logPath := filepath.Join(d.dir, name+".log")
	f, err := os.Create(logPath)
	must(err)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), extraEnv...)
	if user != "" {
		cmd.Env = append(cmd.Env, "NATS_URL="+d.url(user))
	}
	must(cmd.Start())
	return &proc{name: name, cmd: cmd, log: logPath}
}

// deploy starts the topology from the binaries in bins; every service
// serves pprof on its own loopback address (ACTIONBUS_DEBUG_ADDR) for
// -profile.
func deploy(ctx context.Context, bins string, syncAlways bool) *deployment {
	return deployDispatchers(ctx, bins, syncAlways, 1)
}

// deployDispatchers deploys the topology with the runs spread over n
// partitions and n dispatcher processes (dispatcher, dispatcher-2, …).
func deployDispatchers(ctx context.Context, bins string, syncAlways bool, n int) *deployment {
	dir, err := os.MkdirTemp("", "actionbus-bench-")
	must(err)
	d := &deployment{dir: dir, addr: freePort(), debug: map[string]string{}, monitor: freePort()}
	must(os.WriteFile(filepath.Join(dir, "accounts.conf"), []byte(natsconf.Accounts), 0o600))
	// The server serves its own pprof (prof_port), so -profile covers it.
	d.debug["nats-server"] = freePort()
	_, profPort, err := net.SplitHostPort(d.debug["nats-server"])
	must(err)
	// Its monitoring endpoint (http) gives -timeline the messages each
	// connection sent and received.
	// With syncAlways every stored message is on disk before it is
	// acknowledged (an fsync per write), as Restate runs and as the
	// three-node deploy/nats cluster ships.
	sync := ""
	if syncAlways {
		sync = "\n  sync_interval: always\n"
	}
	conf := fmt.Sprintf("listen: %s\nprof_port: %s\nhttp: %s\njetstream { store_dir: %q%s }\ninclude ./accounts.conf\n", d.addr, profPort, d.monitor, filepath.Join(dir, "js"), sync)
	must(os.WriteFile(filepath.Join(dir, "server.conf"), []byte(conf), 0o600))
	var pw []string
	for _, u := range append(natsconf.Users, natsconf.TenantUserNames(natsconf.ExampleTenants...)...) {
		pw = append(pw, natsconf.PasswordVar(u)+"=pw-"+u)
	}
	d.server = d.spawn("nats-server", filepath.Join(bins, "nats-server"), "", pw, "-c", filepath.Join(dir, "server.conf"))
	d.admin = connect(ctx, d.url("admin"), "")
	d.adminJS, err = jetstream.New(d.admin)
	must(err)
	prov := exec.CommandContext(ctx, filepath.Join(bins, "actionbus"), "provision", fmt.Sprintf("--partitions=%d", n))
	prov.Env = append(os.Environ(), "NATS_URL="+d.url("admin"))
	if out, err := prov.CombinedOutput(); err != nil {
		must(fmt.Errorf("actionbus provision: %v: %s", err, out))
	}
	scen := filepath.Join(dir, "scenarios.yaml")
	must(os.WriteFile(scen, []byte(agentScenario), 0o600))
	self, err := os.Executable()
	must(err)
	svc := func(name, bin, user string, args ...string) *proc {
		addr := freePort()
		d.debug[name] = addr
		p := d.spawn(name, bin, user, []string{"ACTIONBUS_DEBUG_ADDR=" + addr}, args...)
		d.services = append(d.services, p)
		return p
	}
	// W2's ten actions are "allowed to run in parallel" (BENCHMARKS.md):
	// the dispatcher's bound on a run's calls in flight (default 8) is set
	// to the workload's width, as a user running ten-wide fan-outs would.
	svc("dispatcher", filepath.Join(bins, "dispatcher"), "dispatcher", fmt.Sprintf("--max-plan-parallel=%d", fanoutWidth))
	for i := 2; i <= n; i++ {
		svc(fmt.Sprintf("dispatcher-%d", i), filepath.Join(bins, "dispatcher"), "dispatcher", fmt.Sprintf("--max-plan-parallel=%d", fanoutWidth))
	}
	svc("planner", filepath.Join(bins, "planner"), "planner", "--scenarios", scen)
	d.auditor = svc("auditor", filepath.Join(bins, "auditor"), "auditor")
	d.auditorBin = filepath.Join(bins, "auditor")
	svc("executor-1", self, "executor", "-serve-executor", "-id", "bench-1")
	svc("executor-2", self, "executor", "-serve-executor", "-id", "bench-2")
	d.nc = connect(ctx, d.url("client"), client.InboxPrefix(""))
	d.c, err = client.New(d.nc, client.Options{})
	must(err)
	// Ready: every dispatcher serves its share of the partitions, echo is
	// in the catalog and a run goes through.
	for n > 1 && d.logLines("dispatcher", `"msg":"partition acquired"`)-d.logLines("dispatcher", `"msg":"partition released"`) < n {
		if ctx.Err() != nil {
			must(fmt.Errorf("the dispatchers never took the %d partitions: %s", n, d.logs()))
		}
		time.Sleep(100 * time.Millisecond) // polling the processes' start-up
	}
	for {
		acts, err := d.c.Actions(ctx)
		if err == nil && slices.ContainsFunc(acts, func(a client.ActionInfo) bool { return a.Name == "echo" }) {
			break
		}
		if ctx.Err() != nil {
			must(fmt.Errorf("echo never appeared in the catalog: %s", d.logs()))
		}
		time.Sleep(100 * time.Millisecond) // polling a process's start-up
	}
	return d
}

// stopAuditor stops the auditor process (for the auditor-off figure).
func (d *deployment) stopAuditor() { d.auditor.stop() }

// startAuditor starts the auditor process again; its durable consumers
// resume where the stopped one left off.
func (d *deployment) startAuditor() {
	p := d.spawn("auditor", d.auditorBin, "auditor", []string{"ACTIONBUS_DEBUG_ADDR=" + d.debug["auditor"]})
	for i, s := range d.services {
		if s == d.auditor {
			d.services[i] = p
		}
	}
	d.auditor = p
}

func (d *deployment) stop() {
	d.nc.Close()
	for _, p := range d.services {
		p.stop()
	}
	d.admin.Close()
	d.server.stop()
	_ = os.RemoveAll(d.dir)
}

// logLines counts the lines holding what in the logs of the processes
// whose name starts with prefix.
func (d *deployment) logLines(prefix, what string) int {
	n := 0
	for _, p := range d.services {
		if !strings.HasPrefix(p.name, prefix) {
			continue
		}
		out, _ := os.ReadFile(p.log)
		n += bytes.Count(out, []byte(what))
	}
	return n
}

// logs returns the tails of the processes' logs (for a failure message).
func (d *deployment) logs() string {
	var b strings.Builder
	for _, p := range append([]*proc{d.server}, d.services...) {
		out, _ := os.ReadFile(p.log)
		if len(out) > 2000 {
			out = out[len(out)-2000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", p.name, out)
	}
	return b.String()
}

// cpu returns the CPU time (user and system) each process of the
// deployment has used so far, the bench's own (the client) as "client"
// (Linux: /proc; empty elsewhere).
func (d *deployment) cpu() map[string]time.Duration {
	out := map[string]time.Duration{}
	read := func(name string, pid int) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// Fields after the command's closing parenthesis; utime and
		// stime are the 14th and 15th of the line, in clock ticks
		// (100 per second on Linux).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		out[name] = time.Duration(u+s) * 10 * time.Millisecond
	}
	for _, p := range append([]*proc{d.server}, d.services...) {
		if p != nil && p.cmd.Process != nil {
			read(p.name, p.cmd.Process.Pid)
		}
	}
	read("client", os.Getpid())
	return out
}

// msgCount is what one process's connections sent to the server
// (publishes, acknowledgements, pull requests) and received from it.
type msgCount struct{ in, out int64 }

// msgs reads the server's connections (its /connz) and sums their message
// counts by process: a service's connection is named actionbus-<service>
// (both executors share a name), the bench's own connections are "client"
// (the admin connection that reads streams back is left out).
func (d *deployment) msgs() map[string]msgCount {
	var connz struct {
		Connections []struct {
			Name    string `json:"name"`
			User    string `json:"authorized_user"`
			InMsgs  int64  `json:"in_msgs"`
			OutMsgs int64  `json:"out_msgs"`
		} `json:"connections"`
	}
	d.monitorJSON("/connz?auth=true&limit=1024", &connz)
	out := map[string]msgCount{}
	for _, c := range connz.Connections {
		name := strings.TrimPrefix(c.Name, "actionbus-")
		switch {
		case c.User == "admin":
			continue
		case name == "":
			name = c.User
		}
		m := out[name]
		m.in += c.InMsgs
		m.out += c.OutMsgs
		out[name] = m
	}
	return out
}

// subChanges reads how many subscriptions the server has added and
// removed so far (its /subsz inserts + removes): each costs it an update
// of its subject index, as a pull that opens its own inbox does.
func (d *deployment) subChanges() int64 {
	var subsz struct {
		Inserts int64 `json:"num_inserts"`
		Removes int64 `json:"num_removes"`
	}
	d.monitorJSON("/subsz", &subsz)
	return subsz.Inserts + subsz.Removes
}

// serverMsgs reads the messages the server received from its clients and
// sent to them so far (its /varz in_msgs + out_msgs).
func (d *deployment) serverMsgs() int64 {
	var varz struct {
		InMsgs  int64 `json:"in_msgs"`
		OutMsgs int64 `json:"out_msgs"`
	}
	d.monitorJSON("/varz", &varz)
	return varz.InMsgs + varz.OutMsgs
}

// monitorJSON decodes what the server's monitoring endpoint path (with
// its query) answers into v.
func (d *deployment) monitorJSON(path string, v any) {
	resp, err := http.Get("http://" + d.monitor + path)
	must(err)
	defer resp.Body.Close()
	must(json.NewDecoder(resp.Body).Decode(v))
}

// profile records a CPU profile of every service, and of the bench's own
// process (the client: client.pprof), for the duration of fn and writes
// them to dir as <service>.pprof.
func (d *deployment) profile(dir string, fn func()) {
	must(os.MkdirAll(dir, 0o755))
	self, err := os.Create(filepath.Join(dir, "client.pprof"))
	must(err)
	defer self.Close()
	must(pprof.StartCPUProfile(self))
	defer pprof.StopCPUProfile()
	done := make(chan struct{})
	errs := make(chan error, len(d.debug))
	for name, addr := range d.debug {
		go func() {
			resp, err := http.Get("http://" + addr + "/debug/pprof/profile?seconds=8")
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(filepath.Join(dir, name+".pprof"))
			if err == nil {
				_, err = f.ReadFrom(resp.Body)
				f.Close()
			}
			errs <- err
		}()
	}
	go func() { fn(); close(done) }()
	<-done
	for range d.debug {
		if err := <-errs; err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		}
	}
}

func connect(ctx context.Context, url, inbox string) *nats.Conn {
	opts := []nats.Option{nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(url, opts...)
	must(err)
	deadline := time.Now().Add(30 * time.Second)
	for !nc.IsConnected() {
		if ctx.Err() != nil || time.Now().After(deadline) {
			must(errors.New("nats-server did not start within 30 s (see its log)"))
		}
		time.Sleep(20 * time.Millisecond) // polling a process's start-up
	}
	return nc
}

// serveExecutor is the bench binary run as an executor process
// (-serve-executor): the service lifecycle of cmd/executor hosting echo.
func serveExecutor(id string) int {
	var c service.Common
	return service.Main("executor", c, func(nc *nats.Conn, log *slog.Logger, m *metrics.Metrics) (service.Runner, error) {
		ex, err := executor.New(nc, executor.Config{ID: id, Slots: 16, Logger: log, Observer: m, ShutdownGrace: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		return ex, registerEcho(ex)
	})
}
