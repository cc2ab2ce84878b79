package readapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/readapi"
)

// BenchmarkReadARunsStoredEvents reads one finished run's stored events:
// through the read service (one request, no consumer), and as clients
// read them before it (an ordered consumer created, fetched from and
// deleted).
func BenchmarkReadARunsStoredEvents(b *testing.B) {
	srv := actionbustest.NewServer(b, actionbustest.Options{})
	srv.StartStack(b, actionbustest.StackOptions{Register: registerEcho})
	nc := srv.Connect(b)
	c, err := client.New(nc, client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.echo", Args: map[string]any{"text": "x"}}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	caller := readapi.NewCaller(nc, "", "default")
	b.Run("read service", func(b *testing.B) {
		for b.Loop() {
			n := 0
			if _, err := caller.Scan(ctx, readapi.OpEvents, readapi.Request{Run: res.RunID}, func(readapi.Msg) bool { n++; return true }); err != nil || n == 0 {
				b.Fatal(err, n)
			}
		}
	})
	b.Run("ordered consumer", func(b *testing.B) {
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			cons, err := js.OrderedConsumer(ctx, "AB_RUNS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ab.run.default." + res.RunID + ".*"}})
			if err != nil {
				b.Fatal(err)
			}
			info, err := cons.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			batch, err := cons.FetchNoWait(int(info.NumPending))
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for range batch.Messages() {
				n++
			}
			if n == 0 {
				b.Fatal("no message")
			}
			_ = js.DeleteConsumer(ctx, "AB_RUNS", cons.CachedInfo().Name)
		}
	})
}
