package client

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Watch delivers the client's tenant's run events to fn, one at a time:
// every stored event from since (from the first when since is zero), then
// each new one as it is stored,
// and the live events (run.started, run.progress) published while it
// watches. It returns when ctx ends (with nil) or when the stream cannot
// be read. Events that do not decode are skipped (the dispatcher rejects
// and reports them). Consoles and dashboards build their view of all runs
// from it; to follow one run, use [Client.Follow].
func (c *Client) Watch(ctx context.Context, since time.Time, fn func(Event)) error {
	out := make(chan Event, 1024)
	live := func(m *nats.Msg) {
		if r, err := c.bus.Receive(m.Subject, m.Header, m.Data); err == nil {
			select {
			case out <- eventOf(r, c.topo.Subjects().RunIDFromSubject(m.Subject)):
			case <-ctx.Done():
			}
		}
	}
	subjects := c.topo.Subjects()
	for _, verb := range []string{"started", "progress"} {
		sub, err := c.nc.Subscribe(subjects.Run(c.tenant, "*", verb), live)
		if err != nil {
			return fmt.Errorf("client: watch: %w", err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // best effort
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.TenantRuns(c.tenant)}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := c.js.OrderedConsumer(ctx, c.topo.StreamRuns(), cfg)
	if err != nil {
		return fmt.Errorf("client: watch: %w", err)
	}
	defer c.dropConsumer(ctx, c.topo.StreamRuns(), cons)
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("client: watch: %w", err)
	}
	defer it.Stop()
	stored := make(chan error, 1)
	go func() {
		for {
			msg, err := it.Next()
			if err != nil {
				stored <- err
				return
			}
			r, err := c.bus.Receive(msg.Subject(), msg.Headers(), msg.Data())
			if err != nil {
				continue // schedules and bad events: nothing to show
			}
			select {
			case out <- eventOf(r, subjects.RunIDFromSubject(msg.Subject())):
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case e := <-out:
			fn(e)
		case err := <-stored:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("client: watch: %w", err)
		case <-ctx.Done():
			it.Stop()
			return nil
		}
	}
}

// Requested returns the request that started a run, as stored on the
// requests stream, and when it was published. It fails when the run's
// request is unknown or no longer stored.
func (c *Client) Requested(ctx context.Context, runID string) (*RunRequest, time.Time, error) {
	req, at, err := c.request(ctx, runID)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("client: request of %s: %w", runID, err)
	}
	out := &RunRequest{RunID: req.RunID, Prompt: req.Prompt, Scenario: req.Scenario, Workflow: req.Workflow, UserID: req.UserID,
		AllowedModes: req.AllowedModes, Metadata: req.Metadata, Deadline: time.Duration(req.DeadlineMs) * time.Millisecond,
		RetryOf: req.RetryOf}
	if a := req.Action; a != nil {
		out.Action = &ActionCall{Name: a.Name, Args: a.Args, IdempotencyKey: a.IdempotencyKey}
	}
	return out, at, nil
}

// dropConsumer deletes an ordered consumer the client made once it is
// done with it (even when ctx has ended), so that many readers do not
// pile up consumers on the stream; a consumer left behind by a lost
// connection expires on its own.
func (c *Client) dropConsumer(ctx context.Context, stream string, cons jetstream.Consumer) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = c.js.DeleteConsumer(dctx, stream, cons.CachedInfo().Name)
}
