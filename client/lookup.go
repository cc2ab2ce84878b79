package client

import (
	"context"
	"fmt"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/readapi"
)

// lookupBound bounds each read [Client.CheckRun] makes: a read service
// that answers at all answers within it.
const lookupBound = 5 * time.Second

// CheckRunID checks the shape of a run id, without reading anything: an
// *actionbus.Error with code invalid_run_id, naming the id, when it is not
// a canonical ULID.
func CheckRunID(runID string) error {
	if err := events.CheckRunID(runID); err != nil {
		return fmt.Errorf("%q is not a run id: %w", clip(runID, 64), err)
	}
	return nil
}

// CheckRun reports whether runID names a run of the client's tenant, and
// never waits for one to appear: it is what a command that names a run
// (follow, cancel, answer, retry) asks first.
//
// It returns nil when the run's request or any of its events is stored;
// an *actionbus.Error with code invalid_run_id, without reading, when
// runID is not a canonical ULID ([CheckRunID]); run_not_found when nothing of the run is
// stored in the tenant (another tenant's run is not found either). Other
// errors are the read service's (none serving: no responders). It makes
// at most two reads of the read service, each bounded by ctx and by five
// seconds.
func (c *Client) CheckRun(ctx context.Context, runID string) error {
	if err := CheckRunID(runID); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, lookupBound)
	defer cancel()
	// Every run has its request on the requests stream (while the stream
	// keeps it); a run whose request has aged out may still have events.
	var p readapi.Page
	err := c.reads.Call(rctx, readapi.OpEvents, readapi.Request{Run: runID, Stream: readapi.StreamRequests,
		Verbs: []string{"requested"}, HeadersOnly: true, Limit: 1}, &p)
	if err != nil {
		return fmt.Errorf("client: look up run %s: %w", runID, err)
	}
	if len(p.Msgs) > 0 {
		return nil
	}
	err = c.reads.Call(rctx, readapi.OpEvents, readapi.Request{Run: runID, HeadersOnly: true, Limit: 1}, &p)
	switch {
	case notFound(err):
		return actionbus.Errorf(actionbus.CodeRunNotFound, "no run %s in tenant %s", runID, c.tenant).WithDetail("runId", runID)
	case err != nil:
		return fmt.Errorf("client: look up run %s: %w", runID, err)
	}
	return nil
}
