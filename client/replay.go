package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/actionbus/actionbus/events"
)

// Recording is what a run's stored events say about it: its request, the
// decision of each cycle, what the planner saw before each decision, and
// its result.
type Recording struct {
	Request *RequestEvent
	// Decisions are the decisions of cycles 1..n, in order.
	Decisions []Decision
	// Observations[i] are the observations the planner saw before
	// deciding cycle i+1.
	Observations [][]Observation
	Result       *Result
}

// Record reads a run's stored events, from its request to its terminal
// event. The run must have ended.
func (c *Client) Record(ctx context.Context, runID string) (*Recording, error) {
	rec := &Recording{}
	decisions := map[int]events.Decision{}
	observed := map[int][]events.Observation{}
	var decodeErr error
	res, err := c.Follow(ctx, runID, func(e Event) {
		switch e.Type {
		case events.TypeDecisionMade:
			var dm events.DecisionMade
			decodeErr = errors.Join(decodeErr, json.Unmarshal(e.Data, &dm))
			if dm.Error == nil {
				decisions[dm.Cycle] = dm.Decision
			}
		case events.TypeDecisionRequested:
			var dr events.DecisionRequested
			decodeErr = errors.Join(decodeErr, json.Unmarshal(e.Data, &dr))
			observed[dr.Cycle] = dr.Observations
		}
	})
	if err != nil {
		return nil, err
	}
	if decodeErr != nil {
		return nil, fmt.Errorf("client: record %s: %w", runID, decodeErr)
	}
	if rec.Request, _, err = c.request(ctx, runID); err != nil {
		return nil, fmt.Errorf("client: record %s: %w", runID, err)
	}
	for cycle := 1; ; cycle++ {
		d, ok := decisions[cycle]
		if !ok {
			break
		}
		rec.Decisions = append(rec.Decisions, d)
		rec.Observations = append(rec.Observations, observed[cycle])
	}
	rec.Result = res
	return rec, nil
}

// ReplayReport compares a recorded run with its replay.
type ReplayReport struct {
	RecordedRunID string
	ReplayRunID   string
	Recorded      *Recording
	Replayed      *Recording
	// Divergences name every difference, in cycle order; none means the
	// replay reproduced the run's decisions, observations and result.
	Divergences []Divergence
}

// Divergence is one difference between a recorded run and its replay.
type Divergence struct {
	// Cycle is the planner cycle (0 for the result).
	Cycle int
	What  string
	// Path is the JSON Pointer (RFC 6901) of the first value that differs
	// inside What ("" when What itself differs, a scalar or a value on one
	// side only).
	Path string
	// Recorded and Replayed are the two values at Path, as compact JSON;
	// a long value is cut to a window of about 240 characters around
	// where the two first differ, with "…" marking what was cut.
	Recorded string
	Replayed string
}

// Replay re-runs a recorded planner run: a new run with the same request,
// whose planner answers each cycle with the decision the recording made
// instead of asking its provider (no LLM call), while actions run again on
// the executors. It returns once the replay ends, with the differences.
// Mutations need approval again: approvals are bound to their run.
func (c *Client) Replay(ctx context.Context, runID string) (*ReplayReport, error) {
	rec, err := c.Record(ctx, runID)
	if err != nil {
		return nil, err
	}
	req := rec.Request
	if req.Action != nil || req.Workflow != nil {
		return nil, fmt.Errorf("client: replay %s: only planner runs can be replayed (workflow and exec runs have no decisions)", runID)
	}
	id, err := c.startReplay(ctx, req, rec.Decisions)
	if err != nil {
		return nil, err
	}
	again, err := c.Record(ctx, id)
	if err != nil {
		return nil, err
	}
	return &ReplayReport{RecordedRunID: runID, ReplayRunID: id, Recorded: rec, Replayed: again, Divergences: compareRuns(rec, again)}, nil
}

func (c *Client) startReplay(ctx context.Context, req *events.RunRequested, decisions []events.Decision) (string, error) {
	id := events.NewID()
	data := *req
	data.RunID = id
	data.Replay = &events.Replay{RunID: req.RunID, Decisions: decisions}
	if _, err := c.bus.Emit(ctx, events.TypeRunRequested, id, c.tenant, id, "", &data); err != nil {
		return "", fmt.Errorf("client: start replay: %w", err)
	}
	return id, nil
}

func compareRuns(a, b *Recording) []Divergence {
	var out []Divergence
	diff := func(cycle int, what string, x, y any) {
		if d, ok := firstDifference(normalize(x), normalize(y)); ok {
			d.Cycle, d.What = cycle, what
			out = append(out, d)
		}
	}
	n := max(len(a.Decisions), len(b.Decisions))
	for i := 0; i < n; i++ {
		var da, db any
		var oa, ob any
		if i < len(a.Decisions) {
			da, oa = a.Decisions[i], normalize(a.Observations[i])
		}
		if i < len(b.Decisions) {
			db, ob = b.Decisions[i], normalize(b.Observations[i])
		}
		diff(i+1, "observations before the decision", oa, ob)
		diff(i+1, "decision", da, db)
	}
	ra, rb := *a.Result, *b.Result
	ra.RunID, rb.RunID = "", ""
	diff(0, "status", ra.Status, rb.Status)
	diff(0, "answer", ra.Answer, rb.Answer)
	diff(0, "output", normalize(ra.Output), normalize(rb.Output))
	if ra.Error != nil || rb.Error != nil {
		var ca, cb string
		if ra.Error != nil {
			ca = string(ra.Error.Code)
		}
		if rb.Error != nil {
			cb = string(rb.Error.Code)
		}
		diff(0, "error code", ca, cb)
	}
	return out
}

// normalize gives values read back from JSON one shape, so that equal
// JSON compares equal.
func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// divergenceWindow is how many bytes of a long value a divergence shows
// on each side of where the two values first differ.
const divergenceWindow = 120

// firstDifference finds the first place where two JSON values (as
// [normalize] gives them: maps, slices, strings, float64, bool, nil)
// differ, in document order (object keys sorted), and reports its JSON
// Pointer and the two values there, a long one cut around the first
// differing byte. It reports false when the values are equal.
func firstDifference(a, b any) (Divergence, bool) {
	path, x, y, ok := locate("", a, b)
	if !ok {
		return Divergence{}, false
	}
	xs, ys := jsonText(x), jsonText(y)
	at := commonPrefix(xs, ys)
	return Divergence{Path: path, Recorded: window(xs, at), Replayed: window(ys, at)}, true
}

// locate descends into a and b while both are objects or both arrays and
// returns the pointer and values of the first difference.
func locate(path string, a, b any) (string, any, any, bool) {
	switch x := a.(type) {
	case map[string]any:
		y, same := b.(map[string]any)
		if !same {
			break
		}
		keys := make([]string, 0, len(x)+len(y))
		for k := range x {
			keys = append(keys, k)
		}
		for k := range y {
			if _, dup := x[k]; !dup {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			xv, inX := x[k]
			yv, inY := y[k]
			p := path + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
			if inX != inY {
				return p, absent(xv, inX), absent(yv, inY), true
			}
			if p, xd, yd, ok := locate(p, xv, yv); ok {
				return p, xd, yd, true
			}
		}
		return "", nil, nil, false
	case []any:
		y, same := b.([]any)
		if !same {
			break
		}
		for i := range max(len(x), len(y)) {
			p := path + "/" + strconv.Itoa(i)
			if i >= len(x) || i >= len(y) {
				var xv, yv any = missing{}, missing{}
				if i < len(x) {
					xv = x[i]
				}
				if i < len(y) {
					yv = y[i]
				}
				return p, xv, yv, true
			}
			if p, xd, yd, ok := locate(p, x[i], y[i]); ok {
				return p, xd, yd, true
			}
		}
		return "", nil, nil, false
	}
	if reflect.DeepEqual(a, b) {
		return "", nil, nil, false
	}
	return path, a, b, true
}

// missing stands for a value one side does not have.
type missing struct{}

func absent(v any, present bool) any {
	if !present {
		return missing{}
	}
	return v
}

// jsonText is v as compact JSON ("(absent)" for a missing value).
func jsonText(v any) string {
	if _, ok := v.(missing); ok {
		return "(absent)"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// window cuts s to divergenceWindow bytes on each side of at, on rune
// boundaries, marking cuts with "…".
func window(s string, at int) string {
	from, to := max(0, at-divergenceWindow), min(len(s), at+divergenceWindow)
	for from > 0 && !utf8.RuneStart(s[from]) {
		from--
	}
	for to < len(s) && !utf8.RuneStart(s[to]) {
		to++
	}
	out := s[from:to]
	if from > 0 {
		out = "…" + out
	}
	if to < len(s) {
		out += "…"
	}
	return out
}

// Retry starts a retry of a failed or canceled run and returns the new
// run's id: the same request, under a new run id, with RetryOf set. A
// workflow reuses every step the failed run completed (their handlers do
// not run again) and resumes at the step that failed; an agent run keeps
// the observations of its cycles up to the last one whose actions all
// succeeded and asks the planner from there; a one-action run runs its
// action again (its idempotency key replays a stored result). The failed
// run's events and audit trail get a "retried" step naming the new run.
// The dispatcher refuses with retry_refused a run that has not failed,
// belongs to another tenant or user, had another definition or prompt, or
// was already retried by another run (a run is retried into one run: the
// refusal's details name it as retriedBy; retry that run instead), or is
// itself a refused retry. It fails with run_not_found, before any request,
// when the client's tenant has no run runID (another tenant's run is not
// there either).
func (c *Client) Retry(ctx context.Context, runID string) (string, error) {
	retry, err := c.RetryRequest(ctx, runID)
	if err != nil {
		return "", err
	}
	return c.Start(ctx, retry)
}

// RetryRequest returns the request of a retry of runID, as [Client.Retry]
// starts it: the run's stored request, with RetryOf set and no run id (a
// new one is drawn). A gateway sets its own user and principal on it
// before starting it: a run requested through a gateway is retried
// through one, as its user.
func (c *Client) RetryRequest(ctx context.Context, runID string) (RunRequest, error) {
	req, _, err := c.request(ctx, runID)
	if err != nil {
		return RunRequest{}, fmt.Errorf("client: retry %s: %w", runID, err)
	}
	retry := RunRequest{WorkflowJSON: rawWorkflow(req.Workflow), Prompt: req.Prompt, Scenario: req.Scenario, UserID: req.UserID,
		AllowedModes: req.AllowedModes, Metadata: req.Metadata, Deadline: time.Duration(req.DeadlineMs) * time.Millisecond, RetryOf: runID}
	if a := req.Action; a != nil {
		retry.Action = &ActionCall{Name: a.Name, Args: a.Args, IdempotencyKey: a.IdempotencyKey}
	}
	return retry, nil
}
