package dispatch

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// endedAlarms cancels the alarm of each run that ended. Left armed, it
// fires once after the run — a timer stored in the timers stream,
// delivered to the dispatcher and to the auditor, audited — to change
// nothing: under steady load, a quarter again of a one-action run's work,
// half a minute after it. Purging the run's schedules from the timers
// stream stores nothing (the server answers the request; no message is
// added to any stream).
//
// Cancels run off the run's path, on a few workers behind a bounded
// queue. When the queue is full, or a purge fails (a dispatcher user
// without $JS.API.STREAM.PURGE on the timers stream, a stream leader being
// elected), the alarm is left to fire, which is harmless; after a failure,
// cancels pause for alarmPause (the first failure is logged as a warning,
// the later ones at debug level).
type endedAlarms struct {
	queue      chan string // filters of ended runs' schedule subjects
	log        *slog.Logger
	pauseUntil atomic.Int64 // unix nanoseconds
	warned     atomic.Bool
}

const (
	alarmQueue        = 4096
	alarmWorkers      = 2
	alarmPause        = 30 * time.Second
	alarmPurgeTimeout = 5 * time.Second
)

func newEndedAlarms(log *slog.Logger) *endedAlarms {
	return &endedAlarms{queue: make(chan string, alarmQueue), log: log}
}

// start purges the queued runs' schedules from timers until ctx ends.
func (a *endedAlarms) start(ctx context.Context, timers jetstream.Stream) {
	for range alarmWorkers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case filter := <-a.queue:
					a.purge(ctx, timers, filter)
				}
			}
		}()
	}
}

func (a *endedAlarms) purge(ctx context.Context, timers jetstream.Stream, filter string) {
	if time.Now().UnixNano() < a.pauseUntil.Load() {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, alarmPurgeTimeout)
	err := timers.Purge(pctx, jetstream.WithPurgeSubject(filter))
	cancel()
	if err == nil || ctx.Err() != nil {
		return
	}
	a.pauseUntil.Store(time.Now().Add(alarmPause).UnixNano())
	msg := "cannot cancel the alarms of ended runs; they fire once, changing nothing (is $JS.API.STREAM.PURGE on the timers stream allowed to the dispatcher's user?)"
	if a.warned.Swap(true) {
		a.log.Debug(msg, "subjects", filter, "err", err)
		return
	}
	a.log.Warn(msg, "subjects", filter, "err", err)
}

// cancel queues the cancel of an ended run's alarm; it never waits.
func (a *endedAlarms) cancel(filter string) {
	select {
	case a.queue <- filter:
	default:
	}
}
