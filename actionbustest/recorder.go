package actionbustest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// DefaultWait is the deadline of the wait helpers when none is given.
const DefaultWait = 10 * time.Second

// Recorded is one message seen by a [Recorder].
type Recorded struct {
	// Subject the message was published on.
	Subject string
	// Header of the message.
	Header nats.Header
	// Data is the message body.
	Data []byte
	// Event is the decoded CloudEvent, or nil when the message is not one.
	Event *event.Event
	// DecodeErr says why Event is nil.
	DecodeErr error
}

// Type returns the CloudEvent type, or "" for a message that is not an
// event.
func (r Recorded) Type() string {
	if r.Event == nil {
		return ""
	}
	return r.Event.Type()
}

// Recorder records every message published on a subject filter, decoded as
// CloudEvents, from the moment [Server.Record] returns. It is safe for
// concurrent use.
type Recorder struct {
	mu      sync.Mutex
	cond    *sync.Cond
	records []Recorded
	sub     *nats.Subscription
}

// Record starts recording subject (wildcards allowed; ">" under the prefix
// when empty). The subscription ends in t.Cleanup.
func (s *Server) Record(t testing.TB, subject string) *Recorder {
	t.Helper()
	if subject == "" {
		subject = s.Prefix + ".>"
	}
	r := &Recorder{}
	r.cond = sync.NewCond(&r.mu)
	nc := s.Connect(t)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		rec := Recorded{Subject: m.Subject, Header: m.Header, Data: m.Data}
		rec.Event, rec.DecodeErr = bus.Decode(m.Subject, m.Header, m.Data)
		r.mu.Lock()
		r.records = append(r.records, rec)
		r.mu.Unlock()
		r.cond.Broadcast()
	})
	if err != nil {
		t.Fatalf("actionbustest: subscribe %s: %v", subject, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("actionbustest: flush: %v", err)
	}
	r.sub = sub
	return r
}

// All returns a copy of everything recorded so far.
func (r *Recorder) All() []Recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Recorded(nil), r.records...)
}

// Count returns how many recorded messages satisfy match.
func (r *Recorder) Count(match func(Recorded) bool) int {
	n := 0
	for _, rec := range r.All() {
		if match(rec) {
			n++
		}
	}
	return n
}

// WaitFor blocks until a recorded message satisfies match (including ones
// recorded before the call) and returns the first such message. It fails the
// test when the deadline (DefaultWait when 0) passes first.
func (r *Recorder) WaitFor(t testing.TB, timeout time.Duration, match func(Recorded) bool) Recorded {
	t.Helper()
	rec, ok := r.waitN(timeout, 1, match)
	if !ok {
		t.Fatalf("actionbustest: no matching event within %s; saw:\n%s", orDefault(timeout), r.describe())
	}
	return rec[0]
}

// WaitForN blocks until n recorded messages satisfy match and returns them.
func (r *Recorder) WaitForN(t testing.TB, timeout time.Duration, n int, match func(Recorded) bool) []Recorded {
	t.Helper()
	recs, ok := r.waitN(timeout, n, match)
	if !ok {
		t.Fatalf("actionbustest: %d matching events not seen within %s (got %d); saw:\n%s", n, orDefault(timeout), len(recs), r.describe())
	}
	return recs
}

// ErrNotSeen is returned by [Recorder.Await] when no recorded message
// matched before the context ended.
var ErrNotSeen = errors.New("actionbustest: no matching message")

// Await is WaitFor for callers that word their own failure: it returns
// the first recorded message that satisfies match (including ones recorded
// before the call), or an error wrapping ErrNotSeen and the context's
// error once ctx ends. A ctx without a deadline waits DefaultWait.
func (r *Recorder) Await(ctx context.Context, match func(Recorded) bool) (Recorded, error) {
	timeout := DefaultWait
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	if timeout <= 0 {
		return Recorded{}, fmt.Errorf("%w: %w", ErrNotSeen, context.DeadlineExceeded)
	}
	stop := context.AfterFunc(ctx, r.wake)
	defer stop()
	recs, ok := r.waitUntil(ctx, timeout, 1, match)
	if !ok {
		cause := ctx.Err()
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		return Recorded{}, fmt.Errorf("%w within %s (%d messages recorded): %w", ErrNotSeen, timeout.Round(time.Millisecond), len(r.All()), cause)
	}
	return recs[0], nil
}

// WaitForType waits for an event of eventType, optionally of one run.
func (r *Recorder) WaitForType(t testing.TB, timeout time.Duration, eventType, runID string) Recorded {
	t.Helper()
	return r.WaitFor(t, timeout, func(rec Recorded) bool {
		return rec.Type() == eventType && (runID == "" || strings.Contains(rec.Subject, "."+runID+"."))
	})
}

// AuditRecords returns the audit records a message of the audit stream
// holds — an audit append holds one or more, in chain order — or nil for
// any other message.
func (r Recorded) AuditRecords() []client.AuditRecord {
	if r.Event == nil {
		return nil
	}
	var data any
	switch r.Event.Type() {
	case events.TypeAuditAppended:
		data = new(events.AuditAppended)
	case events.TypeAuditRecorded:
		data = new(events.AuditRecorded)
	default:
		return nil
	}
	if events.DataAs(r.Event, data) != nil {
		return nil
	}
	recs, _ := events.AuditRecordsOf(&events.Received{Event: r.Event, Data: data})
	return recs
}

// Steps returns the steps of a run a message carries: the one of a
// run.step, those of a run.progress (the live steps of one transition, in
// order; one for a version 1 message), none for any other message.
func (r Recorded) Steps() []events.RunStep {
	if r.Event == nil {
		return nil
	}
	switch r.Event.Type() {
	case events.TypeRunStep:
	case events.TypeRunProgress:
		var p events.RunProgress
		if events.DataAs(r.Event, &p) != nil {
			return nil
		}
		if p.Version == events.ProgressVersion {
			return p.Steps
		}
	default:
		return nil
	}
	var s events.RunStep
	if events.DataAs(r.Event, &s) != nil || s.Name == "" {
		return nil
	}
	return []events.RunStep{s}
}

// WaitForSteps blocks until n steps satisfying match are recorded (steps,
// not messages: one run.progress carries several) and returns them in the
// order recorded. It fails the test when the deadline (DefaultWait when 0)
// passes first.
func (r *Recorder) WaitForSteps(t testing.TB, timeout time.Duration, n int, match func(events.RunStep) bool) []events.RunStep {
	t.Helper()
	matching := func(rec Recorded) []events.RunStep {
		var out []events.RunStep
		for _, s := range rec.Steps() {
			if match(s) {
				out = append(out, s)
			}
		}
		return out
	}
	msgs, ok := r.waitCount(context.Background(), timeout, n, func(rec Recorded) int { return len(matching(rec)) })
	var out []events.RunStep
	for _, m := range msgs {
		out = append(out, matching(m)...)
	}
	if !ok {
		t.Fatalf("actionbustest: %d matching steps not seen within %s (got %d); saw:\n%s", n, orDefault(timeout), len(out), r.describe())
	}
	return out[:n]
}

// WaitForStep blocks until a step satisfying match is recorded and
// returns the first such step ([Recorder.WaitForSteps] for one).
func (r *Recorder) WaitForStep(t testing.TB, timeout time.Duration, match func(events.RunStep) bool) events.RunStep {
	t.Helper()
	return r.WaitForSteps(t, timeout, 1, match)[0]
}

// WaitForAudit blocks until n audit records satisfying match are recorded
// (records, not messages: one audit append holds several) and returns
// them in the order recorded. It fails the test when the deadline
// (DefaultWait when 0) passes first.
func (r *Recorder) WaitForAudit(t testing.TB, timeout time.Duration, n int, match func(client.AuditRecord) bool) []client.AuditRecord {
	t.Helper()
	matching := func(rec Recorded) []client.AuditRecord {
		var out []client.AuditRecord
		for _, a := range rec.AuditRecords() {
			if match(a) {
				out = append(out, a)
			}
		}
		return out
	}
	msgs, ok := r.waitCount(context.Background(), timeout, n, func(rec Recorded) int { return len(matching(rec)) })
	var out []client.AuditRecord
	for _, m := range msgs {
		out = append(out, matching(m)...)
	}
	if !ok {
		t.Fatalf("actionbustest: %d matching audit records not seen within %s (got %d); saw:\n%s", n, orDefault(timeout), len(out), r.describe())
	}
	return out[:n]
}

func (r *Recorder) waitN(timeout time.Duration, n int, match func(Recorded) bool) ([]Recorded, bool) {
	return r.waitUntil(context.Background(), timeout, n, match)
}

// waitUntil waits for n matches until the timeout passes or ctx ends
// (whoever ends ctx must Broadcast r.cond).
func (r *Recorder) waitUntil(ctx context.Context, timeout time.Duration, n int, match func(Recorded) bool) ([]Recorded, bool) {
	return r.waitCount(ctx, timeout, n, func(rec Recorded) int {
		if match(rec) {
			return 1
		}
		return 0
	})
}

// waitCount waits until the messages with a count add up to n, and
// returns them.
func (r *Recorder) waitCount(ctx context.Context, timeout time.Duration, n int, count func(Recorded) int) ([]Recorded, bool) {
	deadline := time.Now().Add(orDefault(timeout))
	// sync.Cond has no deadline; a timer broadcast wakes the waiter once.
	timer := time.AfterFunc(orDefault(timeout), r.wake)
	defer timer.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var found []Recorded
		total := 0
		for _, rec := range r.records {
			if c := count(rec); c > 0 {
				found = append(found, rec)
				if total += c; total >= n {
					return found, true
				}
			}
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return found, false
		}
		r.cond.Wait()
	}
}

// wake wakes the waiters; holding the lock, so that a waiter between its
// check and its Wait cannot miss it.
func (r *Recorder) wake() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cond.Broadcast()
}

func (r *Recorder) describe() string {
	var b strings.Builder
	for _, rec := range r.All() {
		fmt.Fprintf(&b, "  %s %s\n", rec.Subject, rec.Type())
	}
	return b.String()
}

func orDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultWait
	}
	return d
}
