package main

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/internal/embedded"
)

// floorRoundTrip measures the bare JetStream cost that actionbus builds on:
// a request published to a stream, pulled by a minimal hand-written
// consumer that acks it and publishes a result to a second stream, and the
// requester receiving that result. It returns the p50 of one round trip
// and of a 10-way fan-out (10 requests published, all 10 results in).
func floorRoundTrip(ctx context.Context, n int) (one, ten time.Duration) {
	dir, err := os.MkdirTemp("", "actionbus-floor-")
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
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOOR_WORK", Subjects: []string{"floor.work"}, Retention: jetstream.WorkQueuePolicy})
	must(err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOOR_RESULTS", Subjects: []string{"floor.result.>"}})
	must(err)
	cons, err := js.CreateOrUpdateConsumer(ctx, "FLOOR_WORK", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
	must(err)

	// The minimal consumer: 8 workers, like one executor's slots.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	wnc, err := nats.Connect(ns.ClientURL())
	must(err)
	defer wnc.Close()
	wjs, _ := jetstream.New(wnc)
	for i := 0; i < 8; i++ {
		go func() {
			for wctx.Err() == nil {
				msg, err := cons.Next(jetstream.FetchContext(wctx))
				if err != nil {
					continue
				}
				_ = msg.Ack()
				_, _ = wjs.Publish(wctx, "floor.result."+string(msg.Data()), msg.Data())
			}
		}()
	}
	results := make(chan string, 64)
	_, err = nc.Subscribe("floor.result.>", func(m *nats.Msg) { results <- string(m.Data) })
	must(err)
	must(nc.Flush())

	measure := func(k int) time.Duration {
		t0 := time.Now()
		for i := 0; i < k; i++ {
			_, err := js.Publish(ctx, "floor.work", []byte(strconv.Itoa(i)))
			must(err)
		}
		for i := 0; i < k; i++ {
			<-results
		}
		return time.Since(t0)
	}
	for i := 0; i < 50; i++ {
		measure(1)
		measure(10)
	}
	var d1, d10 []time.Duration
	for i := 0; i < n; i++ {
		d1 = append(d1, measure(1))
		d10 = append(d10, measure(10))
	}
	return percentile(d1, 0.5), percentile(d10, 0.5)
}
