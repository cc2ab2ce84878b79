package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/ownership"
)

// partitions serves the partitions of the runs this dispatcher owns.
//
// Every dispatcher keeps a presence key in the dispatchers' bucket and
// watches the bucket; from the live members it computes, as every other
// dispatcher does, which partitions are its own ([ownership.Assign]), and
// serves those partitions' three consumers. A partition that moves to
// another dispatcher is drained (no more pulls; the events in hand
// finish) and unpinned, so that the server pins its next owner's pulls.
//
// The pin, not the presence, keeps two dispatchers from handling one
// partition at once: a partition's consumers deliver only to the client
// the server pinned, so a dispatcher that thinks it owns a partition
// while another still serves it receives nothing until the other lets go
// (or its pin lapses, [bus.PinnedTTL], when it died). The run state's
// revision check stays the last guard; a conflict is counted
// (actionbus_run_state_conflicts_total) and only happens while
// partitions move.
type partitions struct {
	d     *Dispatcher
	kv    jetstream.KeyValue
	self  string
	count int
	// streams are the partitioned streams, by name (to unpin consumers).
	streams map[string]jetstream.Stream

	mu      sync.Mutex
	members []string // the live dispatchers as last seen, self included
	serving map[int]*servedPartition
	wg      sync.WaitGroup
}

type servedPartition struct {
	gen   uint64 // the fences' generation of this serving
	stop  context.CancelFunc
	done  chan struct{}
	since time.Time
}

// presenceRefresh is how often a dispatcher rewrites its presence key,
// well within [bus.DispatcherPresenceTTL].
const presenceRefresh = bus.DispatcherPresenceTTL / 4

// memberKey returns a presence key for the dispatcher: its instance id,
// made a valid key, and a unique suffix, since two dispatchers in one
// process share a default instance id.
func memberKey(instance string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, instance)
	if len(clean) > 64 {
		clean = clean[:64]
	}
	// nuid's first twelve characters are the same for every id of a
	// process; the whole id is unique.
	return clean + "-" + nuid.Next()
}

// servePartitions serves the partitions this dispatcher owns until ctx
// ends, then drains them.
func (d *Dispatcher) servePartitions(ctx context.Context) error {
	runs, err := d.js.Stream(ctx, d.topo.StreamRuns())
	if err != nil {
		return err
	}
	count, err := bus.PartitionsOf(runs.CachedInfo().Config)
	if err != nil {
		return err
	}
	if !slices.Contains(runs.CachedInfo().Config.Subjects, d.bus.Subjects().Fences()) {
		return fmt.Errorf("dispatch: stream %s does not store the partitions' fences (%s): run `actionbus provision` with this release",
			d.topo.StreamRuns(), d.bus.Subjects().Fences())
	}
	var need bus.Requirements
	for p := range count {
		need.Consumers = append(need.Consumers, d.topo.DispatcherConsumers(p)...)
	}
	if err := d.topo.Check(ctx, d.js, need); err != nil {
		return err
	}
	kv, err := d.js.KeyValue(ctx, d.topo.BucketDispatchers())
	if err != nil {
		return err
	}
	streams := map[string]jetstream.Stream{d.topo.StreamRuns(): runs}
	for _, name := range []string{d.topo.StreamTimers(), d.topo.StreamRequests()} {
		if streams[name], err = d.js.Stream(ctx, name); err != nil {
			return err
		}
	}
	ps := &partitions{d: d, kv: kv, self: memberKey(d.cfg.InstanceID), count: count, streams: streams, serving: map[int]*servedPartition{}}
	d.fences.setCount(count)
	return ps.run(ctx)
}

func (ps *partitions) run(ctx context.Context) error {
	log := ps.d.log.With("member", ps.self)
	if err := ps.announce(ctx); err != nil {
		return err
	}
	watch, err := ps.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("dispatch: watch the dispatchers: %w", err)
	}
	defer func() { _ = watch.Stop() }()
	log.Info("dispatcher joined", "partitions", ps.count)
	refresh := time.NewTicker(presenceRefresh)
	defer refresh.Stop()
	live := map[string]bool{ps.self: true}
	caughtUp := false
	for {
		select {
		case <-ctx.Done():
			ps.leave(log)
			return nil
		case <-refresh.C:
			if err := ps.announce(ctx); err != nil && ctx.Err() == nil {
				// Serving goes on: if the presence lapses, the others
				// take this dispatcher's partitions (the server then
				// delivers them to the one it pins) until it is back.
				log.Warn("presence not refreshed", "err", err)
			}
		case e, ok := <-watch.Updates():
			if !ok {
				ps.leave(log)
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("dispatch: the dispatchers' watch ended")
			}
			if e == nil {
				caughtUp = true
			} else if e.Operation() == jetstream.KeyValuePut {
				live[e.Key()] = true
			} else {
				delete(live, e.Key())
			}
			live[ps.self] = true
			if caughtUp {
				ps.reconcile(ctx, log, slices.Sorted(maps.Keys(live)))
			}
		}
	}
}

// announce writes this dispatcher's presence.
func (ps *partitions) announce(ctx context.Context) error {
	pctx, cancel := bus.Bounded(ctx)
	defer cancel()
	_, err := ps.kv.Put(pctx, ps.self, []byte(time.Now().UTC().Format(time.RFC3339Nano)))
	return err
}

// reconcile serves the partitions members give this dispatcher and hands
// on the others.
func (ps *partitions) reconcile(ctx context.Context, log *slog.Logger, members []string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if slices.Equal(members, ps.members) {
		return
	}
	before := ps.members
	if before == nil {
		// Joining: the partitions were the others'.
		before = slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == ps.self })
	}
	ps.members = members
	wasOwner := ownership.Assign(ps.count, before)
	owner := ownership.Assign(ps.count, members)
	start := time.Now()
	forgot := false
	for p, o := range owner {
		sp, serving := ps.serving[p]
		switch {
		case o != ps.self && serving:
			delete(ps.serving, p)
			ps.wg.Add(1)
			go func() {
				defer ps.wg.Done()
				ps.handOn(p, sp)
				ps.d.cfg.Metrics.PartitionMoved(false, ps.owned())
				log.Info("partition released", "partition", p, "to", o, "served_for", time.Since(sp.since).Round(time.Millisecond).String(),
					"drain", time.Since(start).Round(time.Millisecond).String())
			}()
		case o == ps.self && !serving:
			// A dispatcher that is gone cannot hand its partition on: its
			// pin is lifted here instead of waiting for it to lapse. A
			// live one unpins it when its drain is done. With no owner
			// before (no other dispatcher is live), a pin can only be a
			// dead one's.
			previous := wasOwner[p]
			if !forgot {
				ps.d.cache.forgetStates()
				forgot = true
			}
			ps.serving[p] = ps.serve(ctx, p, previous == "" || !slices.Contains(members, previous))
			ps.d.cfg.Metrics.PartitionMoved(true, len(ps.serving))
			log.Info("partition acquired", "partition", p, "from", previous, "members", len(members))
		}
	}
}

// owned returns how many partitions are served.
func (ps *partitions) owned() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.serving)
}

// serve starts serving partition p's consumers, first lifting their pin
// when unpin says it is a dead dispatcher's (off the watch's goroutine:
// an unpin waits for the server, and the presence must not).
func (ps *partitions) serve(ctx context.Context, p int, unpin bool) *servedPartition {
	pctx, stop := context.WithCancel(ctx)
	sp := &servedPartition{stop: stop, done: make(chan struct{}), since: time.Now()}
	sp.gen = ps.d.fences.open(p)
	go func() {
		defer close(sp.done)
		if unpin {
			ps.unpin(p)
		}
		var wg sync.WaitGroup
		for _, c := range ps.d.topo.DispatcherConsumers(p) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ps.d.serveConsumer(pctx, c)
			}()
		}
		wg.Wait()
	}()
	return sp
}

// handOn stops serving partition p, waits for the transitions in hand
// (bounded by the drain grace) and lifts its pin for the next owner.
func (ps *partitions) handOn(p int, sp *servedPartition) {
	sp.stop()
	<-sp.done
	ps.d.fences.close(p, sp.gen)
	ps.unpin(p)
}

// unpin lifts the pin of partition p's consumers, so that the server pins
// the next dispatcher that pulls. A consumer with no pin answers an
// error, which changes nothing.
func (ps *partitions) unpin(p int) {
	for _, c := range ps.d.topo.DispatcherConsumers(p) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := ps.streams[c.Stream].UnpinConsumer(ctx, c.Config.Durable, bus.OwnerGroup)
		cancel()
		if err != nil {
			ps.d.log.Debug("unpin", "consumer", c.Config.Durable, "err", err)
		}
	}
}

// leave drains every partition served, hands them on and deletes the
// presence key, so that the others take the partitions at once.
func (ps *partitions) leave(log *slog.Logger) {
	ps.mu.Lock()
	for p, sp := range ps.serving {
		delete(ps.serving, p)
		ps.wg.Add(1)
		go func() {
			defer ps.wg.Done()
			ps.handOn(p, sp)
		}()
	}
	ps.mu.Unlock()
	ps.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = ps.kv.Delete(ctx, ps.self)
	log.Info("dispatcher left")
}
