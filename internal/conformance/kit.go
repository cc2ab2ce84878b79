// Package conformance is the conformance kit of docs/protocol.md: it
// drives a running executor, in any language, through the protocol's
// cases and reports one row per case with the rule id it checks
// (E-RESULT, E-TIMEOUT, ...).
//
// The kit plays the dispatcher: it publishes crafted action.requested
// events on the pool's work subject, cancels runs with run.canceled
// events and the pool's ended signal, and reads the results from the
// runs stream. It therefore needs
// a connection allowed what the dispatcher is allowed (publish on
// {prefix}.pool.P.request and {prefix}.run.>, read the RUNS and WORK
// streams, pull from the pool's consumer, read the catalog, presence and
// artifact stores of the pool) and more (a pull of its own from the
// pool's consumer, the rejected stream): the services account's admin
// user, whose credentials `actionbus dev` prints as "admin creds" (or
// any connection to `actionbus dev --no-operator`). Each case uses a run
// id of its own that no dispatcher knows, so run it against a
// development or test deployment, on a pool only the executor under test
// serves (actionbus provision --pool conformance), which hosts the
// conformance catalog ([RegisterCatalog] for Go).
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/policy"
)

// Config configures a run of the kit.
type Config struct {
	// Pool is the pool of the executor under test; default "default".
	Pool string
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Tenant is the tenant of the crafted runs; default "default".
	Tenant string
	// CaseTimeout bounds each case; default 10s.
	CaseTimeout time.Duration
}

func (c *Config) setDefaults() {
	if c.Pool == "" {
		c.Pool = bus.DefaultPool
	}
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Tenant == "" {
		c.Tenant = events.DefaultTenant
	}
	if c.CaseTimeout <= 0 {
		c.CaseTimeout = 10 * time.Second
	}
}

// Row is the outcome of one case.
type Row struct {
	// Rule is the protocol rule the case checks (docs/protocol.md).
	Rule string
	// Case describes the case.
	Case string
	// Err is nil when the case passed, else what was expected and got.
	Err error
	// Took is how long the case ran.
	Took time.Duration
}

// Passed reports whether the case passed.
func (r Row) Passed() bool { return r.Err == nil }

// executorCase is one case of the executor kit.
type executorCase struct {
	rule, name string
	run        func(k *kit, ctx context.Context) error
}

// executorCases are the executor cases, in the order they run.
var executorCases = []executorCase{
	{"E-ANNOUNCE", "the catalog lists the conformance actions on the pool", (*kit).announced},
	{"E-RESULT", "a read action's result: subject, attributes, extensions, copied fields", (*kit).readResult},
	{"E-RESULT-ID", "a result's id and Nats-Msg-Id derive from callId and attempt", (*kit).resultID},
	{"E-INPUT", "a schema-invalid input fails action_args_invalid", (*kit).invalidInput},
	{"E-INPUT", "a missing required property: an issue at its key, reason missing", (*kit).inputMissing},
	{"E-INPUT", "a type mismatch: an issue reason type, worded without the value", (*kit).inputType},
	{"E-UNKNOWN-ACTION", "work naming an action not hosted fails action_not_found, acked", (*kit).unknownAction},
	{"E-TIMEOUT", "a call past its timeout fails timeout with details.timeoutMs", (*kit).timeout},
	{"E-CANCEL", "a run canceled mid-call stops the call: canceled", (*kit).cancelMidCall},
	{"E-CANCEL", "queued work of an ended run fails run_ended", (*kit).cancelQueued},
	{"E-REDELIVERY", "a call taken by a crashed executor runs once, deliveries 2", (*kit).redelivery},
	{"E-RESULT-ID", "the same work item delivered twice: one stored result", (*kit).duplicate},
	{"E-OUTPUT", "an output failing its schema fails schema_validation with details.issues", (*kit).outputInvalid},
	{"E-ARTIFACT", "an output over the limit goes to the artifact store", (*kit).artifact},
	{"E-APPROVAL", "a mutate call without an approval fails approval_required", (*kit).noApproval},
	{"E-IDEMPOTENCY", "an idempotent mutation retried replays; another input conflicts", (*kit).idempotency},
	{"E-REJECT", "an undecodable work message: event.rejected recorded, acked", (*kit).reject},
}

// kit drives one executor pool.
type kit struct {
	cfg  Config
	nc   *nats.Conn
	js   jetstream.JetStream
	bus  *bus.Bus
	topo bus.Topology
	subj events.Subjects
}

// RunExecutor drives the executor serving cfg.Pool through every case and
// returns one row per case. It fails only when the kit cannot start (no
// streams); a failing case is a row.
func RunExecutor(ctx context.Context, nc *nats.Conn, cfg Config) ([]Row, error) {
	cfg.setDefaults()
	b, err := bus.Open(nc, bus.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/conformance"})
	if err != nil {
		return nil, err
	}
	topo := bus.Topology{Prefix: cfg.Prefix, Pools: []string{cfg.Pool}}
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	k := &kit{cfg: cfg, nc: nc, js: b.JetStream(), bus: b, topo: topo, subj: topo.Subjects()}
	if _, err := k.js.Consumer(ctx, topo.StreamWork(), bus.PoolConsumer(cfg.Pool)); err != nil {
		return nil, fmt.Errorf("conformance: pool %s has no work consumer (actionbus provision --pool %s): %w", cfg.Pool, cfg.Pool, err)
	}
	rows := make([]Row, 0, len(executorCases))
	for _, c := range executorCases {
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
		cctx, cancel := context.WithTimeout(ctx, cfg.CaseTimeout)
		start := time.Now()
		err := c.run(k, cctx)
		if err != nil && cctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %s: %w", cfg.CaseTimeout, err)
		}
		cancel()
		rows = append(rows, Row{Rule: c.rule, Case: c.name, Err: err, Took: time.Since(start)})
	}
	return rows, nil
}

// PrintTable writes rows as a table, one line per case.
func PrintTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tCASE\tRESULT\tTIME\tDETAIL")
	for _, r := range rows {
		res, detail := "pass", ""
		if r.Err != nil {
			res, detail = "FAIL", r.Err.Error()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Rule, r.Case, res, r.Took.Round(time.Millisecond), detail)
	}
	_ = tw.Flush()
}

// Failed counts the failed rows.
func Failed(rows []Row) int {
	n := 0
	for _, r := range rows {
		if r.Err != nil {
			n++
		}
	}
	return n
}

// request is a work item of a fresh run, with fields set to values no
// default would produce, so that copies can be checked.
func (k *kit) request(action string, args map[string]any) *events.ActionRequested {
	return &events.ActionRequested{RunID: events.NewID(), Tenant: k.cfg.Tenant, CallID: events.NewID(), Cycle: 3, PlanIndex: 2, Attempt: 1,
		Action: action, Args: args, Origin: events.OriginHost, UserID: "conformance-kit", StepID: "conformance", MaxAttempts: 4}
}

// approve binds an approval to req's input, as the dispatcher does for a
// mutate call.
func approve(req *events.ActionRequested) error {
	hash, err := policy.InputHash(req.Args)
	if err != nil {
		return err
	}
	req.Approval = &events.ApprovalGrant{Token: "conformance-kit", Approver: "conformance-kit", Context: events.ApprovalContext{
		ApprovalID: events.NewID(), RunID: req.RunID, StepID: req.StepID, UserID: req.UserID, Action: req.Action,
		InputHash: hash, ExpiresAt: time.Now().Add(10 * time.Minute).UTC()}}
	return nil
}

// publish puts req on the pool's work subject under a fresh event id and
// returns its stream sequence.
func (k *kit) publish(ctx context.Context, req *events.ActionRequested) (uint64, error) {
	e, err := k.bus.New(events.TypeActionRequested, events.NewID(), "", req.RunID, req,
		events.Extension{Name: events.ExtTenant, Value: req.Tenant}, events.Extension{Name: events.ExtCycle, Value: req.Cycle},
		events.Extension{Name: events.ExtPlanIndex, Value: req.PlanIndex}, events.Extension{Name: events.ExtAttempt, Value: req.Attempt},
		events.Extension{Name: events.ExtPool, Value: k.cfg.Pool})
	if err != nil {
		return 0, err
	}
	ack, err := k.bus.Publish(ctx, k.subj.PoolRequest(k.cfg.Pool), e)
	if err != nil {
		return 0, fmt.Errorf("publish work: %w", err)
	}
	return ack.Sequence, nil
}

// endRun ends runID as the dispatcher does when a run with calls on the
// pool is canceled: run.canceled, then the run's id on the pool's ended
// subject, which is what executors hear (E-CANCEL).
func (k *kit) endRun(ctx context.Context, runID string) error {
	if _, err := k.bus.Emit(ctx, events.TypeRunCanceled, events.NewID(), k.cfg.Tenant, runID, "", &events.RunCanceled{RunID: runID, Reason: "conformance kit"}); err != nil {
		return err
	}
	if err := k.nc.Publish(k.subj.PoolEnded(k.cfg.Pool), []byte(runID)); err != nil {
		return err
	}
	return k.nc.FlushWithContext(ctx)
}

// result is a result event as stored.
type result struct {
	subject   string
	msgID     string
	event     *event.Event
	completed *events.ActionCompleted
	failed    *events.ActionFailed
}

func (r *result) String() string {
	switch {
	case r.completed != nil:
		out, _ := json.Marshal(r.completed.Output)
		return fmt.Sprintf("action.completed (output %.200s)", out)
	case r.failed != nil:
		return fmt.Sprintf("action.failed %s (%s)", r.failed.Error.Code, r.failed.Error.Message)
	}
	return r.event.Type()
}

// results reads the stored results of runID, in order, until want of
// them are read or ctx ends.
func (k *kit) results(ctx context.Context, runID string, want int) ([]*result, error) {
	subject := k.subj.StoredRun(k.cfg.Tenant, runID, "result")
	cons, err := k.js.OrderedConsumer(ctx, k.topo.StreamRuns(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, err
	}
	var out []*result
	for len(out) < want {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return out, fmt.Errorf("expected %d result(s) on %s, got %d: %w", want, subject, len(out), err)
		}
		rec, err := k.bus.Receive(msg.Subject(), msg.Headers(), msg.Data())
		if err != nil {
			return out, fmt.Errorf("expected a valid result event on %s, got one that does not decode: %w", subject, err)
		}
		r := &result{subject: rec.Subject, msgID: msg.Headers().Get(jetstream.MsgIDHeader), event: rec.Event}
		switch d := rec.Data.(type) {
		case *events.ActionCompleted:
			r.completed = d
		case *events.ActionFailed:
			r.failed = d
		default:
			return out, fmt.Errorf("expected action.completed or action.failed on %s, got %s", subject, rec.Event.Type())
		}
		out = append(out, r)
	}
	return out, nil
}

// call publishes req and returns its first result.
func (k *kit) call(ctx context.Context, req *events.ActionRequested) (*result, error) {
	if _, err := k.publish(ctx, req); err != nil {
		return nil, err
	}
	return k.first(ctx, req.RunID)
}

func (k *kit) first(ctx context.Context, runID string) (*result, error) {
	rs, err := k.results(ctx, runID, 1)
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// completed returns r's action.completed or an "expected, got" error.
func completed(r *result) (*events.ActionCompleted, error) {
	if r.completed == nil {
		return nil, fmt.Errorf("expected action.completed, got %s", r)
	}
	return r.completed, nil
}

// failedWith checks that r is action.failed with code.
func failedWith(r *result, code actionbus.Code) (*events.ActionFailed, error) {
	if r.failed == nil || r.failed.Error.Code != code {
		return nil, fmt.Errorf("expected action.failed %s, got %s", code, r)
	}
	return r.failed, nil
}

// outputField returns field of an output object, as JSON decoded it.
func outputField(output any, field string) any {
	m, _ := output.(map[string]any)
	return m[field]
}

// waitConsumer polls the pool consumer's state until ok holds or ctx ends.
func (k *kit) waitConsumer(ctx context.Context, what string, ok func(*jetstream.ConsumerInfo) bool) error {
	cons, err := k.js.Consumer(ctx, k.topo.StreamWork(), bus.PoolConsumer(k.cfg.Pool))
	if err != nil {
		return err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := cons.Info(ctx)
		if err == nil && ok(info) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("expected %s, never saw it: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// acked waits until the work item at seq is acknowledged.
func (k *kit) acked(ctx context.Context, seq uint64) error {
	return k.waitConsumer(ctx, fmt.Sprintf("work item %d acknowledged", seq), func(ci *jetstream.ConsumerInfo) bool {
		return ci.AckFloor.Stream >= seq
	})
}

// announced: E-ANNOUNCE.
func (k *kit) announced(ctx context.Context) error {
	kv, err := k.js.KeyValue(ctx, k.topo.BucketCatalog())
	if err != nil {
		return err
	}
	var missing []string
	for _, name := range Catalog {
		if _, err := kv.Get(ctx, actions.CatalogKey(k.cfg.Pool, name)); err != nil {
			missing = append(missing, name)
		}
	}
	if missing != nil {
		return fmt.Errorf("expected the catalog to list the conformance actions on pool %s, missing %s", k.cfg.Pool, strings.Join(missing, ", "))
	}
	return nil
}

// readResult: E-RESULT.
func (k *kit) readResult(ctx context.Context) error {
	req := k.request(ActionEcho, map[string]any{"text": "hello, conformance"})
	r, err := k.call(ctx, req)
	if err != nil {
		return err
	}
	done, err := completed(r)
	if err != nil {
		return err
	}
	var problems []string
	expect := func(what string, want, got any) {
		if fmt.Sprint(want) != fmt.Sprint(got) {
			problems = append(problems, fmt.Sprintf("%s: expected %v, got %v", what, want, got))
		}
	}
	expect("subject", k.subj.Run(k.cfg.Tenant, req.RunID, "result"), r.subject)
	expect("type", events.TypeActionCompleted, r.event.Type())
	expect("specversion", "1.0", r.event.SpecVersion())
	if r.event.Source() == "" {
		problems = append(problems, "source: expected one, got none")
	}
	ext := r.event.Extensions()
	expect("extension runid", req.RunID, ext[events.ExtRunID])
	expect("extension tenant", req.Tenant, ext[events.ExtTenant])
	expect("extension cycle", req.Cycle, ext[events.ExtCycle])
	expect("extension planindex", req.PlanIndex, ext[events.ExtPlanIndex])
	expect("extension attempt", req.Attempt, ext[events.ExtAttempt])
	expect("runId", req.RunID, done.RunID)
	expect("callId", req.CallID, done.CallID)
	expect("cycle", req.Cycle, done.Cycle)
	expect("planIndex", req.PlanIndex, done.PlanIndex)
	expect("attempt", req.Attempt, done.Attempt)
	expect("action", req.Action, done.Action)
	expect("userId", req.UserID, done.UserID)
	expect("stepId", req.StepID, done.StepID)
	expect("maxAttempts", req.MaxAttempts, done.MaxAttempts)
	expect("deliveries", 1, done.Deliveries)
	expect("replayed", false, done.Replayed)
	if done.Executor == "" {
		problems = append(problems, "executor: expected the executor's id, got none")
	}
	if !reflect.DeepEqual(done.Output, map[string]any{"text": "hello, conformance"}) {
		out, _ := json.Marshal(done.Output)
		problems = append(problems, fmt.Sprintf(`output: expected {"text":"hello, conformance"}, got %s`, out))
	}
	if problems != nil {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// resultID: E-RESULT-ID, on an attempt other than the first.
func (k *kit) resultID(ctx context.Context) error {
	req := k.request(ActionEcho, map[string]any{"text": "id"})
	req.Attempt = 2
	r, err := k.call(ctx, req)
	if err != nil {
		return err
	}
	want := events.ResultID(req.CallID, req.Attempt)
	if r.event.ID() != want {
		return fmt.Errorf("expected event id %s (derived from callId and attempt 2), got %s", want, r.event.ID())
	}
	if r.msgID != want {
		return fmt.Errorf("expected Nats-Msg-Id %s (the event id), got %q", want, r.msgID)
	}
	return nil
}

// invalidInput: E-INPUT.
func (k *kit) invalidInput(ctx context.Context) error {
	r, err := k.call(ctx, k.request(ActionEcho, map[string]any{"text": 42, "extra": true}))
	if err != nil {
		return err
	}
	_, err = failedWith(r, actionbus.CodeActionArgsInvalid)
	return err
}

// secretValue is a value the kit's invalid inputs and outputs carry that
// no issue may repeat: an error words the rule, never the value
// ("Validation issues" under E-INPUT).
const secretValue = 918273645

// argsIssues checks the details of r, an action_args_invalid answer of
// action: actionName, a non-empty issues array of {actionName, key,
// reason, error} strings, the first issue repeated at the top, and no
// word of secretValue anywhere.
func argsIssues(r *result, action string) ([]map[string]any, error) {
	f, err := failedWith(r, actionbus.CodeActionArgsInvalid)
	if err != nil {
		return nil, err
	}
	d := f.Error.Details
	raw, _ := json.Marshal(d)
	if fmt.Sprint(d["actionName"]) != action {
		return nil, fmt.Errorf("expected details.actionName %s, got %v (details %s)", action, d["actionName"], clip(string(raw)))
	}
	issues, err := issueList(d, "actionName", "key", "reason", "error")
	if err != nil {
		return nil, err
	}
	for i, is := range issues {
		if is["actionName"] != action {
			return nil, fmt.Errorf("expected issue %d's actionName %s, got %v", i, action, is["actionName"])
		}
	}
	for _, field := range []string{"key", "reason", "error"} {
		if d[field] != issues[0][field] {
			return nil, fmt.Errorf("expected details.%s to repeat the first issue's (%v), got %v", field, issues[0][field], d[field])
		}
	}
	return issues, noSecret(f)
}

// issueList reads details.issues: a non-empty array of objects whose
// fields are all strings.
func issueList(details map[string]any, fields ...string) ([]map[string]any, error) {
	raw, _ := json.Marshal(details)
	list, _ := details["issues"].([]any)
	if len(list) == 0 {
		return nil, fmt.Errorf("expected details.issues, a non-empty array, got details %s", clip(string(raw)))
	}
	issues := make([]map[string]any, 0, len(list))
	for i, x := range list {
		is, _ := x.(map[string]any)
		for _, field := range fields {
			if _, ok := is[field].(string); !ok {
				return nil, fmt.Errorf("expected issue %d to have %s, a string, got %s", i, field, clip(string(raw)))
			}
		}
		issues = append(issues, is)
	}
	return issues, nil
}

// noSecret fails when the error f carries repeats secretValue in its
// details or message: an error words the rule, never the rejected value.
func noSecret(f *events.ActionFailed) error {
	raw, _ := json.Marshal(f.Error.Details)
	if secret := fmt.Sprint(secretValue); strings.Contains(string(raw), secret) || strings.Contains(f.Error.Message, secret) {
		return fmt.Errorf("expected issues that word the rule, never the rejected value %s, got %s", secret, clip(string(raw)))
	}
	return nil
}

// findIssue returns the first issue whose field key is key, nil when none.
func findIssue(issues []map[string]any, field, key string) map[string]any {
	for _, is := range issues {
		if is[field] == key {
			return is
		}
	}
	return nil
}

// inputMissing: E-INPUT, a required property absent: its issue's key is
// the property's pointer (not the object's) and its reason "missing".
func (k *kit) inputMissing(ctx context.Context) error {
	r, err := k.call(ctx, k.request(ActionEcho, map[string]any{}))
	if err != nil {
		return err
	}
	return checkMissing(r)
}

// checkMissing checks the answer to conformance.echo's input {}.
func checkMissing(r *result) error { return checkTextIssue(r, "missing", "a required property absent") }

// checkTextIssue checks that an answer of conformance.echo has an issue
// keyed "/text" — the property's pointer, not its object's — with reason
// want (why says what the reason stands for).
func checkTextIssue(r *result, want, why string) error {
	issues, err := argsIssues(r, ActionEcho)
	if err != nil {
		return err
	}
	is := findIssue(issues, "key", "/text")
	if is == nil {
		return fmt.Errorf(`expected an issue with key "/text" (the property's pointer, not its object's), got %v`, issues)
	}
	if is["reason"] != want {
		return fmt.Errorf(`expected the issue of "/text" to have reason %q (%s), got %q`, want, why, is["reason"])
	}
	return nil
}

// inputType: E-INPUT, a value of the wrong type: its issue's reason is
// the keyword "type", and no issue repeats the value.
func (k *kit) inputType(ctx context.Context) error {
	r, err := k.call(ctx, k.request(ActionEcho, map[string]any{"text": secretValue}))
	if err != nil {
		return err
	}
	return checkType(r)
}

// checkType checks the answer to conformance.echo's input {"text": secretValue}.
func checkType(r *result) error {
	return checkTextIssue(r, "type", "the keyword that failed")
}

// outputInvalid: E-OUTPUT. conformance.shape returns what it is given:
// a fitting output completes; {"name": number} fails schema_validation
// with details.issues {path, keyword, reason}, sorted by path, among them
// /count (required) and /name (type), none repeating the value.
func (k *kit) outputInvalid(ctx context.Context) error {
	r, err := k.call(ctx, k.request(ActionShape, map[string]any{"output": map[string]any{"count": 1, "name": "fits"}}))
	if err != nil {
		return err
	}
	if _, err := completed(r); err != nil {
		return fmt.Errorf("an output that fits its schema: %w", err)
	}
	r, err = k.call(ctx, k.request(ActionShape, map[string]any{"output": map[string]any{"name": secretValue}}))
	if err != nil {
		return err
	}
	return checkOutputIssues(r)
}

// checkOutputIssues checks the answer to conformance.shape returning
// {"name": secretValue}.
func checkOutputIssues(r *result) error {
	f, err := failedWith(r, actionbus.CodeSchemaValidation)
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(f.Error.Details)
	issues, err := issueList(f.Error.Details, "path", "keyword", "reason")
	if err != nil {
		return err
	}
	for i := 1; i < len(issues); i++ {
		if p, prev := issues[i]["path"].(string), issues[i-1]["path"].(string); p < prev {
			return fmt.Errorf("expected details.issues sorted by path, got %q after %q", p, prev)
		}
	}
	for _, want := range [][2]string{{"/count", "required"}, {"/name", "type"}} {
		is := findIssue(issues, "path", want[0])
		if is == nil || is["keyword"] != want[1] {
			return fmt.Errorf("expected an issue {path %q, keyword %q}, got %s", want[0], want[1], clip(string(raw)))
		}
	}
	return noSecret(f)
}

// unknownAction: E-UNKNOWN-ACTION.
func (k *kit) unknownAction(ctx context.Context) error {
	req := k.request("conformance.not-hosted", map[string]any{})
	seq, err := k.publish(ctx, req)
	if err != nil {
		return err
	}
	r, err := k.first(ctx, req.RunID)
	if err != nil {
		return err
	}
	if _, err := failedWith(r, actionbus.CodeActionNotFound); err != nil {
		return err
	}
	return k.acked(ctx, seq)
}

// timeout: E-TIMEOUT (conformance.sleep declares a 1 s timeout).
func (k *kit) timeout(ctx context.Context) error {
	r, err := k.call(ctx, k.request(ActionSleep, map[string]any{"ms": 5000}))
	if err != nil {
		return err
	}
	f, err := failedWith(r, actionbus.CodeTimeout)
	if err != nil {
		return err
	}
	if got := fmt.Sprint(f.Error.Details["timeoutMs"]); got != fmt.Sprint(SleepTimeout.Milliseconds()) {
		return fmt.Errorf("expected details.timeoutMs %d, got %s", SleepTimeout.Milliseconds(), got)
	}
	return nil
}

// cancelMidCall: E-CANCEL, the running half. The run ends once the
// executor holds the call; a cancel that raced ahead of the handler's
// start (run_ended) is tried again once.
func (k *kit) cancelMidCall(ctx context.Context) error {
	var err error
	for range 2 {
		var r *result
		if r, err = k.cancelOnce(ctx); err != nil {
			return err
		}
		if _, err = failedWith(r, actionbus.CodeCanceled); err == nil || r.failed == nil || r.failed.Error.Code != actionbus.CodeRunEnded {
			return err
		}
	}
	return err
}

func (k *kit) cancelOnce(ctx context.Context) (*result, error) {
	req := k.request(ActionSleep, map[string]any{"ms": 60000})
	seq, err := k.publish(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := k.waitConsumer(ctx, "the sleep call delivered", func(ci *jetstream.ConsumerInfo) bool {
		return ci.Delivered.Stream >= seq
	}); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := k.endRun(ctx, req.RunID); err != nil {
		return nil, err
	}
	r, err := k.first(ctx, req.RunID)
	if err != nil {
		return nil, err
	}
	if r.failed != nil && r.failed.Error.Code == actionbus.CodeTimeout {
		return nil, fmt.Errorf("expected action.failed canceled soon after the cancel, got the call's timeout %s later", time.Since(start).Round(time.Millisecond))
	}
	return r, nil
}

// cancelQueued: E-CANCEL, the queued half. Every slot is busy while the
// work item waits in the queue and its run ends; the executor takes it
// once a slot frees.
func (k *kit) cancelQueued(ctx context.Context) error {
	if err := k.fillSlots(ctx); err != nil {
		return err
	}
	req := k.request(ActionEcho, map[string]any{"text": "too late"})
	seq, err := k.publish(ctx, req)
	if err != nil {
		return err
	}
	if err := k.endRun(ctx, req.RunID); err != nil {
		return err
	}
	r, err := k.first(ctx, req.RunID)
	if err != nil {
		return err
	}
	if _, err := failedWith(r, actionbus.CodeRunEnded); err != nil {
		return err
	}
	return k.acked(ctx, seq)
}

// fillSlots occupies every slot of the pool (the slots its executors
// declare in presence) with a sleep call of 900 ms, and waits until all
// are taken and no pull request waits: a busy slot asks for no work
// (E-PULL), so the next work item waits in the queue until a slot frees.
func (k *kit) fillSlots(ctx context.Context) error {
	slots, err := k.poolSlots(ctx)
	if err != nil {
		return err
	}
	fill := k.request(ActionSleep, nil)
	var last uint64
	for i := range slots {
		f := *fill
		f.CallID, f.PlanIndex, f.Args = events.NewID(), i, map[string]any{"ms": 900}
		if last, err = k.publish(ctx, &f); err != nil {
			return err
		}
	}
	return k.waitConsumer(ctx, fmt.Sprintf("all %d slots busy and no pull request waiting (E-PULL)", slots), func(ci *jetstream.ConsumerInfo) bool {
		return ci.Delivered.Stream >= last && ci.NumWaiting == 0
	})
}

// poolSlots sums the slots the pool's executors declare in presence.
func (k *kit) poolSlots(ctx context.Context) (int, error) {
	kv, err := k.js.KeyValue(ctx, k.topo.BucketPresence(k.cfg.Pool))
	if err != nil {
		return 0, err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		var p struct {
			Slots int `json:"slots"`
		}
		if json.Unmarshal(e.Value(), &p) == nil && p.Slots > 0 {
			total += p.Slots
		}
	}
	if total == 0 {
		return 0, fmt.Errorf("expected an executor present on pool %s (presence bucket %s), got none", k.cfg.Pool, k.topo.BucketPresence(k.cfg.Pool))
	}
	return total, nil
}

// redelivery: E-REDELIVERY. The kit fills every slot of the pool with
// sleep calls ([kit.fillSlots]), takes
// the next work item itself as an executor that then crashes, and hands
// it back at once (as the end of a crashed executor's ack wait would,
// sooner). The executor must run it once and report deliveries 2.
func (k *kit) redelivery(ctx context.Context) error {
	if err := k.fillSlots(ctx); err != nil {
		return err
	}
	cons, err := k.js.Consumer(ctx, k.topo.StreamWork(), bus.PoolConsumer(k.cfg.Pool))
	if err != nil {
		return err
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		return err
	}
	if err := k.waitConsumer(ctx, "the kit's pull request waiting", func(ci *jetstream.ConsumerInfo) bool { return ci.NumWaiting >= 1 }); err != nil {
		return err
	}
	req := k.request(ActionIncrement, map[string]any{"key": "redelivery-" + events.NewID()})
	if err := approve(req); err != nil {
		return err
	}
	if _, err := k.publish(ctx, req); err != nil {
		return err
	}
	taken := false
	for msg := range batch.Messages() {
		rec, err := k.bus.Receive(msg.Subject(), msg.Headers(), msg.Data())
		if err == nil {
			if got, ok := rec.Data.(*events.ActionRequested); ok && got.CallID == req.CallID {
				taken = true
			}
		}
		_ = msg.Nak()
	}
	if !taken {
		return fmt.Errorf("expected the kit to take the work item while every slot was busy, got none (an executor that pulls with no free slot breaks E-PULL)")
	}
	r, err := k.first(ctx, req.RunID)
	if err != nil {
		return err
	}
	done, err := completed(r)
	if err != nil {
		return err
	}
	if done.Deliveries != 2 {
		return fmt.Errorf("expected deliveries 2 (the JetStream delivery count), got %d", done.Deliveries)
	}
	if c := fmt.Sprint(outputField(done.Output, "count")); c != "1" || done.Replayed {
		return fmt.Errorf("expected one run (count 1, not replayed), got count %s, replayed %v", c, done.Replayed)
	}
	return nil
}

// duplicate: E-RESULT-ID, the same work item twice under two event ids
// (a redispatch): both answered, one result stored.
func (k *kit) duplicate(ctx context.Context) error {
	req := k.request(ActionEcho, map[string]any{"text": "twice"})
	if _, err := k.publish(ctx, req); err != nil {
		return err
	}
	seq, err := k.publish(ctx, req)
	if err != nil {
		return err
	}
	if _, err := k.first(ctx, req.RunID); err != nil {
		return err
	}
	if err := k.acked(ctx, seq); err != nil {
		return err
	}
	subject := k.subj.StoredRun(k.cfg.Tenant, req.RunID, "result")
	stream, err := k.js.Stream(ctx, k.topo.StreamRuns())
	if err != nil {
		return err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return err
	}
	n := uint64(0)
	for _, count := range info.State.Subjects {
		n += count
	}
	if n != 1 {
		return fmt.Errorf("expected 1 stored result for a call answered twice, got %d (result ids not derived from callId and attempt)", n)
	}
	return nil
}

// artifact: E-ARTIFACT, with an output of 1 MiB: over the default limit
// (256 KiB) and over half the default max payload.
func (k *kit) artifact(ctx context.Context) error {
	const size = 1 << 20
	r, err := k.call(ctx, k.request(ActionBig, map[string]any{"bytes": size}))
	if err != nil {
		return err
	}
	done, err := completed(r)
	if err != nil {
		return err
	}
	if len(done.Artifacts) != 1 {
		return fmt.Errorf("expected the result to carry 1 artifact reference, got %d", len(done.Artifacts))
	}
	ref := done.Artifacts[0]
	if outputField(done.Output, "artifact") == nil {
		return fmt.Errorf(`expected output {"artifact": reference}, got %v`, clip(fmt.Sprint(done.Output)))
	}
	a, err := artifacts.Read(ctx, k.js, k.topo, k.cfg.Tenant, ref)
	if err != nil {
		return fmt.Errorf("expected the artifact %s readable for tenant %s, got %w", ref.ID, k.cfg.Tenant, err)
	}
	var out struct {
		Data string `json:"data"`
	}
	if err := json.Unmarshal(a.Data, &out); err != nil || len(out.Data) != size {
		return fmt.Errorf(`expected the artifact to hold the output {"data": %d x}, got %d bytes (%v)`, size, len(a.Data), err)
	}
	return nil
}

// noApproval: E-APPROVAL.
func (k *kit) noApproval(ctx context.Context) error {
	r, err := k.call(ctx, k.request(ActionIncrement, map[string]any{"key": "unapproved-" + events.NewID()}))
	if err != nil {
		return err
	}
	_, err = failedWith(r, actionbus.CodeApprovalRequired)
	return err
}

// idempotency: E-IDEMPOTENCY. A mutate call is retried (attempt 2, same
// idempotency key): the stored result is replayed, the count does not
// move. The key with another input is a conflict.
func (k *kit) idempotency(ctx context.Context) error {
	req := k.request(ActionIncrement, map[string]any{"key": "idem-" + events.NewID()})
	req.IdempotencyKey = "conformance-" + req.CallID
	if err := approve(req); err != nil {
		return err
	}
	r, err := k.call(ctx, req)
	if err != nil {
		return err
	}
	first, err := completed(r)
	if err != nil {
		return err
	}
	if c := fmt.Sprint(outputField(first.Output, "count")); c != "1" || first.Replayed {
		return fmt.Errorf("expected the first call to run (count 1, not replayed), got count %s, replayed %v", c, first.Replayed)
	}
	retry := *req
	retry.Attempt = 2
	if _, err := k.publish(ctx, &retry); err != nil {
		return err
	}
	rs, err := k.results(ctx, req.RunID, 2)
	if err != nil {
		return err
	}
	again, err := completed(rs[1])
	if err != nil {
		return err
	}
	if c := fmt.Sprint(outputField(again.Output, "count")); c != "1" || !again.Replayed {
		return fmt.Errorf("expected the retry replayed (count 1, replayed true), got count %s, replayed %v", c, again.Replayed)
	}
	other := k.request(ActionIncrement, map[string]any{"key": "other-" + events.NewID()})
	other.IdempotencyKey = req.IdempotencyKey
	if err := approve(other); err != nil {
		return err
	}
	r, err = k.call(ctx, other)
	if err != nil {
		return err
	}
	_, err = failedWith(r, actionbus.CodeIdempotencyConflict)
	return err
}

// reject: E-REJECT.
func (k *kit) reject(ctx context.Context) error {
	since := time.Now().Add(-time.Second)
	ack, err := k.js.Publish(ctx, k.subj.PoolRequest(k.cfg.Pool), []byte("conformance: not a CloudEvent"))
	if err != nil {
		return fmt.Errorf("publish work: %w", err)
	}
	if err := k.acked(ctx, ack.Sequence); err != nil {
		return err
	}
	subject := k.subj.Rejected(k.topo.StreamWork())
	cons, err := k.js.OrderedConsumer(ctx, k.topo.StreamRejected(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject},
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
	if err != nil {
		return err
	}
	for {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return fmt.Errorf("expected an event.rejected on %s for work item %d, got none: %w", subject, ack.Sequence, err)
		}
		rec, err := k.bus.Receive(msg.Subject(), msg.Headers(), msg.Data())
		if err != nil {
			continue
		}
		if rej, ok := rec.Data.(*events.EventRejected); ok && rej.Stream == k.topo.StreamWork() && rej.StreamSequence == ack.Sequence {
			return nil
		}
	}
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
