package main

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// serveBroken serves pool as a deliberately broken executor, as one
// written without docs/protocol.md might be (BROKEN=1): it answers every
// work item action.completed with the item's arguments as output,
// validating nothing, under a fresh event id each time (so a call
// answered twice is stored twice), and never announces its actions. The
// conformance kit must fail it.
func serveBroken(ctx context.Context, nc *nats.Conn, pool string) error {
	b, err := bus.Open(nc, bus.BusConfig{Source: "/broken-executor"})
	if err != nil {
		return err
	}
	topo := bus.Topology{Pools: []string{pool}}
	cons, err := b.JetStream().Consumer(ctx, topo.StreamWork(), bus.PoolConsumer(pool))
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		rec, err := b.Receive(msg.Subject(), msg.Headers(), msg.Data())
		if err != nil {
			_ = msg.Term()
			return
		}
		req, ok := rec.Data.(*events.ActionRequested)
		if !ok {
			_ = msg.Term()
			return
		}
		done := &events.ActionCompleted{RunID: req.RunID, CallID: req.CallID, Cycle: req.Cycle, PlanIndex: req.PlanIndex, Attempt: req.Attempt,
			Action: req.Action, Output: req.Args, Executor: "broken", Deliveries: 1, UserID: req.UserID, StepID: req.StepID, MaxAttempts: req.MaxAttempts}
		if _, err := b.Emit(ctx, events.TypeActionCompleted, events.NewID(), events.TenantOr(req.Tenant), req.RunID, "", done,
			events.Extension{Name: events.ExtCycle, Value: req.Cycle}, events.Extension{Name: events.ExtPlanIndex, Value: req.PlanIndex},
			events.Extension{Name: events.ExtAttempt, Value: req.Attempt}); err != nil {
			_ = msg.Nak()
			return
		}
		_ = msg.Ack()
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	return nil
}
