package bus_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// BenchmarkStoreTenWorkItems stores a ten-wide fan-out's work items in
// a one-server file stream, with and without fsync per write: as ten
// publishes awaited together (what Bus.EmitAll does), as one atomic
// batch (nats-server ≥ 2.12) and as ten publishes spread over five
// streams, neither of which the commit path uses. Measured
// 2026-12-04 (2 cores, two sittings): separate 2.3–2.9 ms with fsync,
// 0.24–0.36 ms without; atomic 3.4–4.8 ms and 3.2–4.4 ms — nats-server
// 2.15 stages every atomic batch to a one-replica file stream in a file
// store of its own, created per batch (newBatchStore), which costs more
// than the fsyncs the batch's one sync saves (docs/architecture.md,
// "Atomic batches"). Spread over five streams (two items each, each
// stream syncing its own files), they took 2.5–2.7 ms against 3.0–3.1
// for one stream (2026-12-06, three runs of 300): the disk, not the
// stream, serializes the fsyncs, so partitioning the work stream would
// not take a fan-out's fsyncs off its path.
func BenchmarkStoreTenWorkItems(b *testing.B) {
	const spreadStreams = 5
	for _, sync := range []string{"always", "default"} {
		for _, mode := range []string{"separate", "atomic", "spread"} {
			b.Run("sync="+sync+"/"+mode, func(b *testing.B) {
				opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: b.TempDir(), NoLog: true, NoSigs: true, SyncAlways: sync == "always"}
				s, err := server.NewServer(opts)
				if err != nil {
					b.Fatal(err)
				}
				go s.Start()
				defer s.Shutdown()
				if !s.ReadyForConnections(10 * time.Second) {
					b.Fatal("nats-server not ready")
				}
				nc, err := nats.Connect(s.ClientURL())
				if err != nil {
					b.Fatal(err)
				}
				defer nc.Close()
				js, err := jetstream.New(nc)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"ab.pool.*.request"},
					Storage: jetstream.FileStorage, AllowAtomicPublish: true, Duplicates: time.Minute}); err != nil {
					b.Fatal(err)
				}
				for k := range spreadStreams {
					if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK" + strconv.Itoa(k), Subjects: []string{"ab.pool.*.request." + strconv.Itoa(k)},
						Storage: jetstream.FileStorage, Duplicates: time.Minute}); err != nil {
						b.Fatal(err)
					}
				}
				item, id := make([]byte, 680), 0
				for b.Loop() {
					msgs := make([]*nats.Msg, 10)
					for k := range msgs {
						id++
						msgs[k] = &nats.Msg{Subject: "ab.pool.default.request", Data: item, Header: nats.Header{jetstream.MsgIDHeader: []string{strconv.Itoa(id)}}}
						if mode == "spread" {
							msgs[k].Subject += "." + strconv.Itoa(k%spreadStreams)
						}
					}
					if mode == "atomic" {
						if _, err := jetstreamext.PublishMsgBatch(ctx, js, msgs, jetstreamext.BatchFlowControl{}); err != nil {
							b.Fatal(err)
						}
						continue
					}
					futures := make([]jetstream.PubAckFuture, len(msgs))
					for k, m := range msgs {
						if futures[k], err = js.PublishMsgAsync(m); err != nil {
							b.Fatal(err)
						}
					}
					for _, f := range futures {
						select {
						case <-f.Ok():
						case err := <-f.Err():
							b.Fatal(err)
						case <-ctx.Done():
							b.Fatal(ctx.Err())
						}
					}
				}
			})
		}
	}
}
