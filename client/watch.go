package client

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Requested returns the request that started a run, as stored on the
// requests stream, and when it was published. It fails with run_not_found
// when the client's tenant has no such run (another tenant's run is not
// there either).
func (c *Client) Requested(ctx context.Context, runID string) (*RunRequest, time.Time, error) {
	req, at, err := c.request(ctx, runID)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("client: request of %s: %w", runID, err)
	}
	out := &RunRequest{RunID: req.RunID, Prompt: req.Prompt, Scenario: req.Scenario, Workflow: typedWorkflow(req.Workflow), UserID: req.UserID,
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
