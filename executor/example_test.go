package executor_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"testing/fstest"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/executor"
)

// Host one typed action in your own binary. Its input and output JSON
// Schemas are derived from the Go types; a returned *actionbus.Error
// chooses the failure code.
func Example() {
	type StockIn struct {
		SKU string `json:"sku" jsonschema:"minLength=1"`
	}
	type StockOut struct {
		Available int `json:"available"`
	}
	inventory := map[string]int{"A-1": 12}

	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		fmt.Println("no NATS server to serve; the example only shows the code")
		return
	}
	defer nc.Drain()
	ex, err := executor.New(nc, executor.Config{Pool: "default", Slots: 4})
	if err != nil {
		log.Fatal(err)
	}
	err = executor.Register(ex, executor.Action{Name: "inventory.checkStock", Description: "Units available for a SKU.", Mode: executor.ModeRead},
		func(ctx context.Context, in StockIn, call executor.Call) (executor.Result[StockOut], error) {
			n, ok := inventory[in.SKU]
			if !ok {
				return executor.Result[StockOut]{}, actionbus.Errorf("sku_not_found", "unknown sku %q", in.SKU)
			}
			return executor.Result[StockOut]{Output: StockOut{Available: n}, Summary: fmt.Sprintf("%d available", n)}, nil
		})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := ex.Run(ctx); err != nil { // serves until ctx ends, then drains
		log.Fatal(err)
	}
}

// Host a bundled skill: its SKILL.md (front matter: name, description,
// tools, handoff targets; body: the planner's instructions) and a handler
// per tool. Planners reach the tools with execute_skill_tool once the skill
// is active; each runs as the hidden action skill.<skill>.<tool>, through
// policy, approvals and audit like any action.
func ExampleRegisterSkill() {
	skillDir := fstest.MapFS{"stock-report/SKILL.md": {Data: []byte(`---
name: stock-report
description: Report stock levels.
tools:
  - name: stock_of
    description: Units available for a SKU.
    parameters: {type: object, properties: {sku: {type: string}}, required: [sku]}
---
Look up each SKU the user names with stock_of, then answer with a table.
`)}}
	skill, err := executor.LoadSkill(skillDir, "stock-report") // or os.DirFS("skills")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(skill.Name, len(skill.Tools), "tool(s)")

	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		return // no NATS server to serve; the example only shows the code
	}
	defer nc.Drain()
	ex, err := executor.New(nc, executor.Config{Pool: "default"})
	if err != nil {
		log.Fatal(err)
	}
	err = executor.RegisterSkill(ex, skill, map[string]executor.ToolFunc{
		"stock_of": func(ctx context.Context, args map[string]any, call executor.Call) (map[string]any, error) {
			return map[string]any{"sku": args["sku"], "available": 12, "resultKind": "evidence"}, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	// ex.Run(ctx) publishes the skill with the executor's actions.

	// Output:
	// stock-report 1 tool(s)
}

// An interceptor joins every handler call of an executor: here it logs
// each call's action and outcome. Config.Interceptors[0] is outermost.
func ExampleInterceptor() {
	logCalls := func(ctx context.Context, call executor.Call, next executor.Next) (executor.Output, error) {
		out, err := next(ctx, call)
		log.Printf("%s (call %s, attempt %d): err=%v", call.Action, call.CallID, call.Attempt, err)
		return out, err
	}
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		fmt.Println("no NATS server to serve; the example only shows the code")
		return
	}
	defer nc.Drain()
	ex, err := executor.New(nc, executor.Config{Pool: "default", Interceptors: []executor.Interceptor{logCalls}})
	if err != nil {
		log.Fatal(err)
	}
	_ = ex // register actions, then ex.Run(ctx)
}
