package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// ClientConfig configures a run of the client kit.
type ClientConfig struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Wait bounds the wait for the client under test to start a run;
	// default 30s.
	Wait time.Duration
	// Listening, when set, is called once the kit listens: start the
	// client under test then.
	Listening func()
}

// RunClient checks what a client puts on the wire when it starts a run
// (C-START): it listens on every tenant's run.requested subject, waits up
// to cfg.Wait for the client under test to start one run, and checks that
// event. The client's other rules (C-FOLLOW, C-WAIT, C-ANSWER, C-APPROVE,
// C-AUDIT) need a dispatcher's answers and are not checked here.
func RunClient(ctx context.Context, nc *nats.Conn, cfg ClientConfig) ([]Row, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = events.DefaultPrefix
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 30 * time.Second
	}
	b, err := bus.Open(nc, bus.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/conformance"})
	if err != nil {
		return nil, err
	}
	subj := b.Subjects()
	msgs := make(chan *nats.Msg, 1)
	sub, err := nc.ChanSubscribe(subj.AnyRun("requested"), msgs)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	if err := nc.LastError(); err != nil {
		// A subscription refused by permissions is reported only here.
		return nil, fmt.Errorf("conformance: listen on %s: %w", subj.AnyRun("requested"), err)
	}
	if cfg.Listening != nil {
		cfg.Listening()
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, cfg.Wait)
	defer cancel()
	var m *nats.Msg
	select {
	case m = <-msgs:
	case <-wctx.Done():
		return []Row{{Rule: "C-START", Case: "the client publishes run.requested on {prefix}.run.{tenant}.{runId}.requested", Took: time.Since(start),
			Err: fmt.Errorf("expected a run.requested within %s, got none", cfg.Wait)}}, nil
	}
	took := time.Since(start)
	row := func(name string, err error) Row { return Row{Rule: "C-START", Case: name, Err: err, Took: took} }
	rec, err := b.Receive(m.Subject, m.Header, m.Data)
	rows := []Row{row("run.requested is a valid CloudEvent on its subject, its data fits its schema", err)}
	if err != nil {
		return rows, nil
	}
	tenant, runID := subj.RunFromSubject(m.Subject)
	data, _ := rec.Data.(*events.RunRequested)
	ext := rec.Event.Extensions()
	var bindErr error
	switch {
	case data == nil:
		bindErr = fmt.Errorf("expected run.requested data, got %s", rec.Event.Type())
	case data.RunID != runID || fmt.Sprint(ext[events.ExtRunID]) != runID:
		bindErr = fmt.Errorf("expected data.runId and the runid extension to be the subject's run %s, got %q and %v", runID, data.RunID, ext[events.ExtRunID])
	case fmt.Sprint(ext[events.ExtTenant]) != tenant:
		bindErr = fmt.Errorf("expected the tenant extension to be the subject's tenant %s, got %v", tenant, ext[events.ExtTenant])
	}
	rows = append(rows, row("the subject, data.runId and the runid and tenant extensions agree", bindErr))
	var idErr error
	if !events.ValidRunID(runID) {
		idErr = fmt.Errorf("expected the run id to be a ULID (26 upper-case characters), got %q", runID)
	}
	rows = append(rows, row("the run id is a ULID", idErr))
	var eventIDErr error
	if rec.Event.ID() != runID {
		eventIDErr = fmt.Errorf("expected event id %s (the run id: a retried start is stored once), got %s", runID, rec.Event.ID())
	}
	rows = append(rows, row("the event id is the run id", eventIDErr))
	return rows, nil
}
