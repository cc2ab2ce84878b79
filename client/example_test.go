package client_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/stack"
)

// startDeployment runs an embedded server and the four services, as
// `actionbus dev` does, and returns a connection to it.
func startDeployment(ctx context.Context, scenarios string, register func(*executor.Executor) error) (*nats.Conn, func()) {
	dir, _ := os.MkdirTemp("", "actionbus-example-")
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir})
	if err != nil {
		panic(err)
	}
	nc, _ := nats.Connect(ns.ClientURL())
	js, _ := jetstream.New(nc)
	if err := (events.Topology{}).Provision(ctx, js); err != nil {
		panic(err)
	}
	sc, err := planner.ParseScenarios([]byte(scenarios))
	if err != nil {
		panic(err)
	}
	script, _ := planner.NewScript(sc)
	st, err := stack.Start(ctx, nc, stack.Config{Provider: script, Register: register})
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
