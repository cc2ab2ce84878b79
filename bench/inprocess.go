package main

import (
	"context"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/stack"
)

// measureInProcess measures W1–W4 and A1 with an embedded server and
// every service in this process, as `actionbus dev` runs them (two
// executors, auditor on).
func measureInProcess(ctx context.Context, reps int) []Figure {
	dir, err := os.MkdirTemp("", "actionbus-bench-inproc-")
	must(err)
	defer os.RemoveAll(dir)
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir})
	must(err)
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect(ns.ClientURL())
	must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(err)
	must(bus.Topology{}.Provision(ctx, js))
	sc, err := planner.ParseScenarios([]byte(agentScenario))
	must(err)
	script, err := planner.NewScript(sc)
	must(err)
	svc, err := nats.Connect(ns.ClientURL())
	must(err)
	defer svc.Close()
	st, err := stack.Start(ctx, svc, stack.Config{Provider: script, Executors: 2, Slots: 16, Register: registerEcho,
		Dispatcher: dispatch.Config{RunLimits: events.RunLimits{MaxPlanParallel: fanoutWidth}}})
	must(err)
	defer func() { _ = st.Stop() }()
	c, err := client.New(nc, client.Options{})
	must(err)
	ab := actionbusSystem{c: c}
	s := series{}
	for r := 0; r < reps; r++ {
		measureRep(ctx, r, ab, ab.agent, s, nil, probes{})
	}
	var figs []Figure
	for _, n := range []string{"W1 p50", "W2 p50", "W3 p50", "W4 runs/s", "A1 p50"} {
		m, lo, hi := median(s[n])
		unit := "ms"
		if n == "W4 runs/s" {
			unit = "runs/s"
		}
		figs = append(figs, Figure{Name: n, System: "in-process", Value: m, Min: lo, Max: hi, Unit: unit, Reps: s[n]})
	}
	return figs
}
