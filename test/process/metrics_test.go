package process

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/embedded"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the sum of the samples of name whose labels contain
// every given label pair.
func metric(body, name string, labels ...string) float64 {
	total := 0.0
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(m[1], l)
		}
		if v, err := strconv.ParseFloat(m[2], 64); err == nil && ok {
			total += v
		}
	}
	return total
}

// TestServicesServeMetricsAndReadiness starts the four service processes
// on an empty server: each answers /healthz at once and /readyz only once
// provisioning created what it needs; a run then moves the counters.
func TestServicesServeMetricsAndReadiness(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts four processes")
	}
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	bin := buildServices(t)
	addrs := map[string]string{}
	for _, svc := range []string{"dispatcher", "planner", "auditor", "executor"} {
		addrs[svc] = freeAddr(t)
		startService(t, filepath.Join(bin, svc), ns.ClientURL(), "--metrics-addr", addrs[svc])
	}
	for svc, addr := range addrs {
		require.Eventually(t, func() bool {
			code, _ := get("http://" + addr + "/healthz")
			return code == http.StatusOK
		}, 20*time.Second, 20*time.Millisecond, "%s /healthz", svc)
		code, body := get("http://" + addr + "/readyz")
		assert.Equal(t, http.StatusServiceUnavailable, code, "%s is not ready before provisioning", svc)
		assert.Contains(t, body, "missing_topology", svc)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.NoError(t, bus.Topology{}.Provision(ctx, js))
	for svc, addr := range addrs {
		require.Eventually(t, func() bool {
			code, _ := get("http://" + addr + "/readyz")
			return code == http.StatusOK
		}, 20*time.Second, 20*time.Millisecond, "%s becomes ready", svc)
	}

	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		list, _ := c.Actions(ctx)
		return len(list) >= 4
	}, 30*time.Second, 50*time.Millisecond)
	for i := 0; i < 3; i++ {
		res, err := c.Run(ctx, client.RunRequest{Scenario: "delivery-triage", Prompt: "triage"}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	}
	scrape := func(svc string) string {
		code, body := get("http://" + addrs[svc] + "/metrics")
		require.Equal(t, http.StatusOK, code)
		return body
	}
	// A service counts what it did after it published it (the dispatcher
	// a run's end, an executor a result), so a client can have its result
	// before the counter moved: each service is scraped until its last
	// counter has settled.
	settled := func(svc string, done func(body string) bool) string {
		require.Eventually(t, func() bool {
			code, b := get("http://" + addrs[svc] + "/metrics")
			return code == http.StatusOK && done(b)
		}, 10*time.Second, 20*time.Millisecond, "%s's counters settle", svc)
		return scrape(svc)
	}
	d := settled("dispatcher", func(b string) bool {
		return metric(b, "actionbus_run_duration_seconds_count", `state="completed"`) >= 3
	})
	assert.Equal(t, 3.0, metric(d, "actionbus_runs_total", `state="started"`))
	assert.Equal(t, 3.0, metric(d, "actionbus_runs_total", `kind="agent"`, `state="completed"`))
	assert.Equal(t, 3.0, metric(d, "actionbus_run_duration_seconds_count", `state="completed"`))
	assert.Greater(t, metric(d, "actionbus_events_handled_total", `consumer="dispatcher-p0"`, `outcome="ok"`), 20.0)
	p := scrape("planner")
	assert.Equal(t, 3.0, metric(p, "actionbus_decisions_total", `type="plan"`, `provider="script"`))
	assert.Equal(t, 3.0, metric(p, "actionbus_decisions_total", `type="final"`))
	e := settled("executor", func(b string) bool { return metric(b, "actionbus_action_seconds_count") >= 15 })
	assert.Equal(t, 3.0, metric(e, "actionbus_actions_total", `action="delivery.searchJobs"`, `outcome="succeeded"`))
	assert.Equal(t, 9.0, metric(e, "actionbus_actions_total", `action="delivery.getJob"`, `outcome="succeeded"`))
	assert.Equal(t, 15.0, metric(e, "actionbus_action_seconds_count"))
	assert.Equal(t, 0.0, metric(e, "actionbus_actions_in_flight"))
	require.Eventually(t, func() bool {
		return metric(scrape("auditor"), "actionbus_audit_records_total", `kind="action"`) >= 30
	}, 10*time.Second, 50*time.Millisecond, "audit records counted")
}
