package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The floor of BENCHMARKS.md: a hand-written JetStream dispatcher with two
// consumers, on the same server as actionbus, measured in the same run.
// The client publishes the work with a JetStream publish; executors bound
// to one shared durable pull consumer echo it to a results subject; the
// dispatcher's own durable consumer routes the result back to the client.
// Nothing else: no state, no audit, no validation. It stores 2 messages
// per action (the work and the result).

const (
	floorWork, floorResults = "FLOOR_WORK", "FLOOR_RESULTS"
	floorIDHeader           = "Floor-Id"
)

type floor struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	seq     atomic.Uint64
	waiters sync.Map // id -> chan []byte
	stops   []func()
	conns   []*nats.Conn
}

// startFloor creates the floor's two streams and consumers on the server
// at url (as a user allowed everything) and starts two executors of 8
// slots each and the dispatcher, each on its own connection.
func startFloor(ctx context.Context, url string) *floor {
	conn := func() (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(url)
		must(err)
		js, err := jetstream.New(nc)
		must(err)
		return nc, js
	}
	f := &floor{}
	f.nc, f.js = conn()
	f.conns = append(f.conns, f.nc)
	_, err := f.js.CreateStream(ctx, jetstream.StreamConfig{Name: floorWork, Subjects: []string{"floor.work"}, Retention: jetstream.WorkQueuePolicy})
	must(err)
	_, err = f.js.CreateStream(ctx, jetstream.StreamConfig{Name: floorResults, Subjects: []string{"floor.result.>"}})
	must(err)
	execCons, err := f.js.CreateOrUpdateConsumer(ctx, floorWork, jetstream.ConsumerConfig{Durable: "exec", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
	must(err)
	dispCons, err := f.js.CreateOrUpdateConsumer(ctx, floorResults, jetstream.ConsumerConfig{Durable: "disp", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
	must(err)

	for range 2 { // two executors
		nc, js := conn()
		f.conns = append(f.conns, nc)
		work := make(chan jetstream.Msg, 16)
		cc, err := execCons.Consume(func(m jetstream.Msg) { work <- m })
		must(err)
		f.stops = append(f.stops, cc.Stop)
		for range 8 {
			go func() {
				for m := range work {
					id := m.Headers().Get(floorIDHeader)
					out := nats.NewMsg("floor.result." + id)
					out.Data = m.Data()
					if _, err := js.PublishMsg(ctx, out); err != nil {
						_ = m.Nak()
						continue
					}
					_ = m.Ack()
				}
			}()
		}
	}
	dnc, _ := conn()
	f.conns = append(f.conns, dnc)
	cc, err := dispCons.Consume(func(m jetstream.Msg) {
		subj := m.Subject()
		_ = dnc.Publish("floor.done."+subj[len("floor.result."):], m.Data())
		_ = m.Ack()
	})
	must(err)
	f.stops = append(f.stops, cc.Stop)
	_, err = f.nc.Subscribe("floor.done.*", func(m *nats.Msg) {
		if ch, ok := f.waiters.LoadAndDelete(m.Subject[len("floor.done."):]); ok {
			ch.(chan []byte) <- m.Data
		}
	})
	must(err)
	must(f.nc.Flush())
	return f
}

func (f *floor) stop() {
	for _, s := range f.stops {
		s()
	}
	for _, nc := range f.conns {
		nc.Close()
	}
}

// submit publishes one work item and returns the channel its result
// arrives on; async publishes when many go at once.
func (f *floor) submit(ctx context.Context, in map[string]any, async bool) (chan []byte, error) {
	id := strconv.FormatUint(f.seq.Add(1), 10)
	ch := make(chan []byte, 1)
	f.waiters.Store(id, ch)
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg("floor.work")
	m.Header.Set(floorIDHeader, id)
	m.Data = b
	if async {
		_, err = f.js.PublishMsgAsync(m)
	} else {
		_, err = f.js.PublishMsg(ctx, m)
	}
	return ch, err
}

func (f *floor) await(ctx context.Context, ch chan []byte) (any, error) {
	select {
	case b := <-ch:
		var v any
		return v, json.Unmarshal(b, &v)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		return nil, fmt.Errorf("floor: no result in a minute")
	}
}

func (f *floor) single(ctx context.Context, in map[string]any) error {
	ch, err := f.submit(ctx, in, false)
	if err != nil {
		return err
	}
	out, err := f.await(ctx, ch)
	if err != nil {
		return err
	}
	if !same(out, in) {
		return mismatch("floor single", out, in)
	}
	return nil
}

func (f *floor) fanout(ctx context.Context, ins []map[string]any) error {
	chs := make([]chan []byte, len(ins))
	for k, in := range ins {
		var err error
		if chs[k], err = f.submit(ctx, in, true); err != nil {
			return err
		}
	}
	select {
	case <-f.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	// Results are reassembled in declaration order.
	for k, ch := range chs {
		out, err := f.await(ctx, ch)
		if err != nil {
			return err
		}
		if !same(out, ins[k]) {
			return mismatch("floor fanout", out, ins[k])
		}
	}
	return nil
}

func (f *floor) chain(ctx context.Context, in map[string]any, n int) error {
	var out any = in
	for k := 0; k < n; k++ {
		prev, _ := out.(map[string]any)
		next := chainStep(prev, k)
		ch, err := f.submit(ctx, next, false)
		if err != nil {
			return err
		}
		if out, err = f.await(ctx, ch); err != nil {
			return err
		}
	}
	if want := chainStep(in, n-1); !same(out, want) {
		return mismatch("floor chain", out, want)
	}
	return nil
}
