package executor_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"

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
