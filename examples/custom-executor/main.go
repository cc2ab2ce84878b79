// Command custom-executor shows that your own binary can host actions: it
// registers one action wrapping existing service logic and serves the
// default pool of an actionbus deployment.
//
//	NATS_URL=nats://127.0.0.1:4222 go run .
//	actionbus exec inventory.checkStock --input '{"sku":"A-1"}'
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/executor"
)

// StockIn is the action's input; its JSON Schema is derived from the type.
type StockIn struct {
	SKU string `json:"sku" jsonschema:"minLength=1,description=stock keeping unit"`
}

// StockOut is the action's output.
type StockOut struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
}

// inventory stands in for your existing service logic.
var inventory = map[string]int{"A-1": 12, "B-7": 0}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	url := os.Getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url)
	if err != nil {
		log.Error("connect", "err", err)
		os.Exit(1)
	}
	defer nc.Drain()

	ex, err := executor.New(nc, executor.Config{Pool: "default", Slots: 4, Logger: log})
	if err != nil {
		log.Error("executor", "err", err)
		os.Exit(1)
	}
	err = executor.Register(ex, executor.Action{
		Name:        "inventory.checkStock",
		Description: "How many units of a SKU are available.",
		Mode:        executor.ModeRead,
	}, func(ctx context.Context, in StockIn, call executor.Call) (executor.Result[StockOut], error) {
		n, ok := inventory[in.SKU]
		if !ok {
			return executor.Result[StockOut]{}, actionbus.Errorf("sku_not_found", "unknown sku %q", in.SKU)
		}
		return executor.Result[StockOut]{Output: StockOut{SKU: in.SKU, Available: n}, Summary: "checked " + in.SKU}, nil
	})
	if err != nil {
		log.Error("register", "err", err)
		os.Exit(1)
	}
	if err := ex.Run(ctx); err != nil {
		log.Error("run", "err", err)
		os.Exit(1)
	}
}
