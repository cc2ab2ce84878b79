package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/stack"
)

// startDeployment runs an embedded server and the four services, as
// `actionbus dev` does, and returns a connection to it.
func startDeployment(ctx context.Context, scenarios string, register func(*executor.Executor) error) (*nats.Conn, func()) {
	return startDeploymentWith(ctx, scenarios, register, dispatch.Config{})
}

func startDeploymentWith(ctx context.Context, scenarios string, register func(*executor.Executor) error, dc dispatch.Config) (*nats.Conn, func()) {
	dir, _ := os.MkdirTemp("", "actionbus-example-")
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir})
	if err != nil {
		panic(err)
	}
	nc, _ := nats.Connect(ns.ClientURL())
	js, _ := jetstream.New(nc)
	if err := (bus.Topology{}).Provision(ctx, js); err != nil {
		panic(err)
	}
	sc, err := planner.ParseScenarios([]byte(scenarios))
	if err != nil {
		panic(err)
	}
	script, _ := planner.NewScript(sc)
	st, err := stack.Start(ctx, nc, stack.Config{Provider: script, Register: register, Dispatcher: dc})
	if err != nil {
		panic(err)
	}
	return nc, func() {
		_ = st.Stop()
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(dir)
	}
}

func registerEcho(ex *executor.Executor) error {
	type msg struct {
		Message string `json:"message"`
	}
	return executor.Register(ex, executor.Action{Name: "demo.echo", Description: "Echo a message back."},
		func(_ context.Context, in msg, _ executor.Call) (executor.Result[msg], error) {
			return executor.Result[msg]{Output: in, Summary: "echoed"}, nil
		})
}

// Start a run, follow its steps live, and read its result.
func ExampleClient_Run() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, stop := startDeployment(ctx, `
scenarios:
  echo:
    decisions:
      - {type: action, name: demo.echo, args: {message: '{{ .Prompt }}'}}
      - {type: final, answer: 'echo said: {{ index .Results "demo.echo" "message" }}'}
`, registerEcho)
	defer stop()

	c, err := client.New(nc, client.Options{})
	if err != nil {
		panic(err)
	}
	res, err := c.Run(ctx, client.RunRequest{Prompt: "hello", Scenario: "echo"}, func(e client.Event) {
		if s, ok := e.Step(); ok && s.Status != "" {
			fmt.Println(s.Name, s.Action, s.Status)
		}
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, "-", res.Answer)
	// Output:
	// action-completed demo.echo ok
	// final  ok
	// completed - echo said: hello
}

// Run one action directly, as `actionbus exec` does: no planner is asked
// and the run ends with the action's output.
func ExampleRunRequest_action() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, stop := startDeployment(ctx, `scenarios: {}`, registerEcho)
	defer stop()

	c, _ := client.New(nc, client.Options{})
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "demo.echo", Args: map[string]any{"message": "hi"}}}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, res.Output)
	// Output: completed map[message:hi]
}

// Follow every step of a run. Each transition's live steps cross the
// server as one run.progress message; Run and Follow deliver them as one
// Event per step, in order, so that Step reads each.
func ExampleEvent_Step() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, stop := startDeployment(ctx, `scenarios: {}`, registerEcho)
	defer stop()

	c, _ := client.New(nc, client.Options{})
	_, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "demo.echo", Args: map[string]any{"message": "hi"}}}, func(e client.Event) {
		if s, ok := e.Step(); ok {
			fmt.Println(strings.TrimSpace(e.Type + " " + s.Name + " " + s.Action))
		}
	})
	if err != nil {
		panic(err)
	}
	// Output:
	// io.actionbus.run.progress policy-evaluated demo.echo
	// io.actionbus.run.progress act
	// io.actionbus.run.progress action-dispatched demo.echo
	// io.actionbus.run.progress action-completed demo.echo
	// io.actionbus.run.progress observe
}

// A mutation waits for an approval; an approver holding an approval key
// looks at what it would approve, then signs it. Approve returns once the
// dispatcher accepted the grant (a refusal is an error with its code).
func ExampleClient_Approve() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := []byte("0123456789abcdef0123456789abcdef")
	nc, stop := startDeploymentWith(ctx, `scenarios: {}`, func(ex *executor.Executor) error {
		type in struct {
			Service string `json:"service"`
		}
		return executor.Register(ex, executor.Action{Name: "ops.restart", Mode: executor.ModeMutate, Description: "Restart a service."},
			func(_ context.Context, x in, call executor.Call) (executor.Result[in], error) {
				return executor.Result[in]{Output: x, Summary: "restarted " + x.Service + ", approved by " + call.Approval.Approver}, nil
			})
	}, dispatch.Config{ApprovalKeys: policy.Keys{"ann": {Secret: key}}})
	defer stop()

	c, _ := client.New(nc, client.Options{})
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "ops.restart", Args: map[string]any{"service": "api"}},
		AllowedModes: []string{"read", "mutate"}}, func(e client.Event) {
		s, ok := e.Step()
		if !ok || s.Name != "awaiting-approval" {
			return
		}
		id, _ := s.Details["approvalId"].(string)
		p, err := c.Approval(ctx, id)
		if err != nil {
			panic(err)
		}
		fmt.Println("approving", p.Context.Action, "with input", p.Input)
		if err := c.Approve(ctx, id, "ann", key); err != nil {
			panic(err)
		}
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, "-", res.Answer)
	// Output:
	// approving ops.restart with input map[service:api]
	// completed - restarted api, approved by ann
}

// Read a run's audit records: minimized, hash-chained, in order.
func ExampleClient_AuditStream() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, stop := startDeployment(ctx, `scenarios: {}`, registerEcho)
	defer stop()

	c, _ := client.New(nc, client.Options{})
	began := time.Now()
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "demo.echo", Args: map[string]any{"message": "hi"}}}, nil)
	if err != nil {
		panic(err)
	}
	// Live, from when the run began: records arrive as the auditor writes them; the run's terminal
	// record is its last, so the callback stops there.
	var kinds []string
	done := errors.New("terminal record seen")
	err = c.AuditStream(ctx, client.AuditQuery{RunID: res.RunID, Since: began, Live: true}, func(_ uint64, rec client.AuditRecord) error {
		if rec.Kind != "run" {
			return nil
		}
		kinds = append(kinds, rec.Kind+"/"+rec.Status)
		if rec.Status == "completed" {
			return done
		}
		return nil
	})
	if !errors.Is(err, done) {
		panic(err)
	}
	fmt.Println(kinds)
	// Output: [run/requested run/completed]
}

// Watch a tenant's runs, as a dashboard does: every stored event from a
// point in time, then new ones as they are stored.
func ExampleClient_Watch() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, stop := startDeployment(ctx, `scenarios: {}`, registerEcho)
	defer stop()

	c, _ := client.New(nc, client.Options{})
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "demo.echo", Args: map[string]any{"message": "hi"}}}, nil)
	if err != nil {
		panic(err)
	}
	wctx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	err = c.Watch(wctx, time.Now().Add(-time.Hour), func(e client.Event) {
		if e.RunID == res.RunID && e.Type == "io.actionbus.run.completed" {
			fmt.Println("seen:", e.Type)
			stopWatching()
		}
	})
	fmt.Println("watch ended:", err)
	// Output:
	// seen: io.actionbus.run.completed
	// watch ended: <nil>
}
