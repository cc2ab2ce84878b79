package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/jsoncodec"
	"github.com/actionbus/actionbus/internal/payload"
)

// NoRun is the audit subject token of events that belong to no run.
const NoRun = "norun"

// Record kinds: the last token of the audit subject.
const (
	KindRun       = "run"
	KindStep      = "step"
	KindPolicy    = "policy"
	KindDecision  = "decision"
	KindSynthesis = "synthesis"
	KindAction    = "action"
	KindApproval  = "approval"
	KindInput     = "input"
	KindTimer     = "timer"
	KindRejected  = "rejected"
)

// ActionLookup returns what the auditor knows of an action from the
// catalog: its audit policy and mode (nil and "" when unknown).
type ActionLookup func(name string) (policy *actions.AuditPolicy, mode string)

// Builder turns events into audit records, applying the payload policy.
type Builder struct {
	// Defaults is the payload policy of actions that set none.
	Defaults payload.Policy
	// Lookup finds an action's own audit policy; nil means none.
	Lookup ActionLookup
	// Prefix is the subject prefix; default "ab".
	Prefix string

	// execRuns remembers the action of recent exec runs, so their
	// terminal output gets the action's policy.
	execMu   sync.Mutex
	execRuns map[string]string
}

const maxExecRuns = 10000

func (b *Builder) rememberExec(runID, action string) {
	b.execMu.Lock()
	defer b.execMu.Unlock()
	if b.execRuns == nil {
		b.execRuns = map[string]string{}
	}
	if len(b.execRuns) >= maxExecRuns {
		for k := range b.execRuns {
			delete(b.execRuns, k)
			break
		}
	}
	b.execRuns[runID] = action
}

func (b *Builder) execAction(runID string) string {
	b.execMu.Lock()
	defer b.execMu.Unlock()
	return b.execRuns[runID]
}

// sha returns the hex SHA-256 of s, or "" for "".
func sha(s string) string {
	if s == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func (b *Builder) action(name string) (payload.Policy, string) {
	var own *actions.AuditPolicy
	var mode string
	if b.Lookup != nil && name != "" {
		own, mode = b.Lookup(name)
	}
	return payload.Effective(b.Defaults, own), mode
}

// Record builds the audit record of an event, without its chain hashes.
// Payloads go through the payload policy; raw approval tokens and
// idempotency keys are replaced by their SHA-256.
func (b *Builder) Record(r *events.Received) events.AuditRecorded {
	sum := sha256.Sum256(r.Event.Data())
	rec := events.AuditRecorded{
		RunID: r.RunID(), Tenant: r.Tenant, EventID: r.Event.ID(), EventType: r.Event.Type(), EventSubject: r.Subject,
		EventSource: r.Event.Source(), EventTime: r.Event.Time().UTC(), PayloadHash: hex.EncodeToString(sum[:]),
	}
	def := b.Defaults
	modes := func(p payload.Policy, fields ...string) map[string]string {
		m := map[string]string{}
		for _, f := range fields {
			switch f {
			case "input":
				m[f] = p.Input
			case "output":
				m[f] = p.Output
			case "error":
				m[f] = p.Error
			}
		}
		return m
	}
	switch d := r.Data.(type) {
	case *events.RunRequested:
		rec.Kind, rec.Status, rec.UserID = KindRun, "requested", d.UserID
		if events.ValidRunID(d.RetryOf) {
			rec.RetryOf = d.RetryOf // the run it asks to retry (refused across tenants, kinds and users)
		}
		in := map[string]any{}
		if d.Prompt != "" {
			in["prompt"] = d.Prompt
		}
		if d.Metadata != nil {
			in["metadata"] = d.Metadata
		}
		pol := def
		if d.Action != nil {
			// An exec run: the input is the action's, under its policy.
			pol, rec.Mode = b.action(d.Action.Name)
			rec.Action, rec.IdempotencyKeyHash = d.Action.Name, sha(d.Action.IdempotencyKey)
			b.rememberExec(d.RunID, d.Action.Name)
			in["action"] = map[string]any{"name": d.Action.Name, "args": payload.Redact(d.Action.Args, pol.RedactPaths)}
		}
		if d.Workflow != nil {
			in["workflow"] = b.redactWorkflow(d.Workflow)
		}
		if d.Replay != nil {
			rec.Summary = "replay of " + d.Replay.RunID
		}
		rec.Input, rec.PayloadModes = payload.ApplyInput(pol, in), modes(pol, "input")
	case *events.RunStarted:
		rec.Kind, rec.Status, rec.Summary, rec.RetryOf = KindRun, "started", d.Kind, d.RetryOf
	case *events.RunCompleted:
		rec.Kind, rec.Status, rec.RunUsage = KindRun, "completed", d.Usage
		rec.Output, rec.OutputSummary, rec.PayloadModes = b.runOutput(d)
	case *events.RunFailed:
		rec.Kind, rec.Status, rec.Summary, rec.RunUsage = KindRun, "failed", string(d.Error.Code), d.Usage
		e := d.Error
		rec.Error, rec.PayloadModes = payload.ApplyError(def, &e), modes(def, "error")
	case *events.RunCanceled:
		rec.Kind, rec.Status, rec.RunUsage = KindRun, "canceled", d.Usage
	case *events.CancelRequested:
		rec.Kind, rec.Status, rec.UserID = KindRun, "cancel_requested", d.RequestedBy
	case *events.RunStep:
		rec.Kind, rec.Status, rec.Summary, rec.Action = KindStep, d.Status, d.Name, d.Action
		if d.Name == "policy-evaluated" {
			rec.Kind, rec.Policy = KindPolicy, d.Details["snapshot"]
		}
		if by, ok := d.Details["retriedBy"].(string); ok && d.Name == "retried" && events.ValidRunID(by) {
			rec.RetriedBy = by
		}
	case *events.DecisionRequested:
		rec.Kind, rec.Status, rec.Summary = KindDecision, "requested", fmt.Sprintf("cycle %d", d.Cycle)
	case *events.DecisionMade:
		rec.Kind, rec.Status, rec.Usage = KindDecision, d.Decision.Type, d.Usage
		switch {
		case d.Error != nil:
			rec.Status, rec.Summary = "error", string(d.Error.Code)
		case d.Decision.Type == events.DecisionAction:
			rec.Action = d.Decision.Name
		case d.Decision.Type == events.DecisionPlan:
			names := make([]string, len(d.Decision.Actions))
			for i, a := range d.Decision.Actions {
				names[i] = a.Name
			}
			rec.Summary = strings.Join(names, ", ")
		}
	case *events.SynthesisRequested:
		rec.Kind, rec.Status, rec.Summary = KindSynthesis, "requested", fmt.Sprintf("%s %d", d.Part, d.Index)
	case *events.SynthesisCompleted:
		rec.Kind, rec.Status, rec.Summary, rec.Usage = KindSynthesis, "completed", fmt.Sprintf("%s %d", d.Part, d.Index), d.Usage
		if d.Error != nil {
			rec.Status = "failed"
		}
	case *events.ActionRequested:
		pol, mode := b.action(d.Action)
		rec.Kind, rec.Status, rec.Action, rec.Mode = KindAction, "started", d.Action, mode
		rec.ExecutionID, rec.StepID, rec.UserID, rec.Attempt, rec.MaxAttempts = d.CallID, d.StepID, d.UserID, d.Attempt, d.MaxAttempts
		rec.Input, rec.PayloadModes = payload.ApplyInput(pol, d.Args), modes(pol, "input")
		rec.IdempotencyKeyHash = sha(d.IdempotencyKey)
		if d.Approval != nil {
			rec.ApprovalTokenHash = sha(d.Approval.Token)
		}
		rec.Policy = d.Policy // the evaluation that admitted the call
	case *events.ActionCompleted:
		pol, mode := b.action(d.Action)
		rec.Kind, rec.Status, rec.Action, rec.Mode = KindAction, "succeeded", d.Action, mode
		rec.ExecutionID, rec.StepID, rec.UserID, rec.Attempt, rec.MaxAttempts = d.CallID, d.StepID, d.UserID, d.Attempt, d.MaxAttempts
		rec.Output, rec.OutputSummary = payload.ApplyOutput(pol, d.Output, d.Summary)
		rec.PayloadModes = modes(pol, "output")
	case *events.ActionFailed:
		pol, mode := b.action(d.Action)
		rec.Kind, rec.Status, rec.Action, rec.Mode, rec.Summary = KindAction, "failed", d.Action, mode, string(d.Error.Code)
		rec.ExecutionID, rec.StepID, rec.UserID, rec.Attempt, rec.MaxAttempts = d.CallID, d.StepID, d.UserID, d.Attempt, d.MaxAttempts
		e := d.Error
		rec.Error, rec.PayloadModes = payload.ApplyError(pol, &e), modes(pol, "error")
	case *events.ApprovalRequested:
		pol, mode := b.action(d.Context.Action)
		rec.Kind, rec.Status, rec.Action, rec.Mode = KindApproval, "requested", d.Context.Action, mode
		rec.ExecutionID, rec.StepID, rec.UserID = d.Context.ApprovalID, d.Context.StepID, d.Context.UserID
		rec.Input, rec.PayloadModes = payload.ApplyInput(pol, d.Input), modes(pol, "input")
		rec.Summary = d.Reason
	case *events.ApprovalGranted:
		rec.Kind, rec.Status, rec.ExecutionID, rec.UserID = KindApproval, "granted", d.ApprovalID, d.Approver
		rec.ApprovalTokenHash = sha(d.Token)
	case *events.ApprovalDenied:
		rec.Kind, rec.Status, rec.ExecutionID, rec.UserID, rec.Summary = KindApproval, "denied", d.ApprovalID, d.Approver, d.Reason
	case *events.ApprovalResolved:
		rec.Kind, rec.Status, rec.ExecutionID, rec.UserID = KindApproval, "answer_"+d.Outcome, d.ApprovalID, d.Approver
		if d.Error != nil {
			rec.Summary = string(d.Error.Code)
		}
	case *events.InputProvided:
		rec.Kind, rec.Status, rec.UserID = KindInput, "provided", d.ProvidedBy
		rec.Input, rec.PayloadModes = payload.ApplyInput(def, map[string]any{"answer": d.Answer}), modes(def, "input")
	case *events.TimerFired:
		rec.Kind, rec.Status, rec.Summary = KindTimer, "fired", d.Kind+" "+d.Stage
	case *events.EventRejected:
		rec.Kind, rec.RunID, rec.Status, rec.Summary = KindRejected, d.RunID, "rejected", string(d.Reason.Code)
		if d.Stream != "" && d.StreamSequence > 0 {
			// The record names the event that was rejected, where it is
			// stored: that event has its record.
			rec.Source = &events.AuditSource{Stream: d.Stream, Seq: d.StreamSequence}
		}
		// A rejected event is audited with the run it names, under the
		// tenant of the subject it was published on (which its
		// publisher's account imports bound it to) — also when it names
		// no valid run: one tenant's junk never lands in another's (the
		// default tenant's) audit trail. A subject that names no tenant
		// leaves it with the services' (the default) tenant, never the
		// tenant attribute the rejection's publisher wrote.
		rec.Tenant = ""
		if t, _ := events.MustSubjects(b.Prefix).RunFromSubject(d.OriginalSubject); events.ValidTenant(t) {
			rec.Tenant = t
		}
	default:
		rec.Kind = KindRun
	}
	if !events.ValidRunID(rec.RunID) {
		// A run id that is no subject token (a forged rejection's) never
		// names an audit subject: the record goes to the records of no run.
		rec.RunID = NoRun
	}
	return rec
}

// runOutput minimizes a run's result: a workflow's step outputs each under
// their action's policy, an exec run's output under its action's, an
// agent's answer under the default.
func (b *Builder) runOutput(d *events.RunCompleted) (any, string, map[string]string) {
	if out, ok := d.Output.(map[string]any); ok {
		steps, isWF := out["steps"].([]any)
		byStep, _ := out["outputByStep"].(map[string]any)
		if isWF && byStep != nil {
			minimized := map[string]any{}
			summaries := map[string]any{}
			for _, s := range steps {
				m, _ := s.(map[string]any)
				id, _ := m["id"].(string)
				name, _ := m["action"].(string)
				pol, _ := b.action(name)
				v, sum := payload.ApplyOutput(pol, byStep[id], "")
				if v != nil {
					minimized[id] = v
				}
				if sum != "" {
					summaries[id] = sum
				}
			}
			res := map[string]any{"workflowName": out["workflowName"], "steps": payload.Clone(steps), "outputByStep": minimized}
			if len(summaries) > 0 {
				res["outputSummaryByStep"] = summaries
			}
			return res, "", map[string]string{"output": "per step"}
		}
	}
	pol := b.Defaults
	if name := b.execAction(d.RunID); name != "" {
		pol, _ = b.action(name)
		v, sum := payload.ApplyOutput(pol, d.Output, d.Answer)
		return v, sum, map[string]string{"output": pol.Output}
	}
	out := map[string]any{}
	if d.Answer != "" {
		out["answer"] = d.Answer
	}
	if d.Output != nil {
		out["output"] = d.Output
	}
	v, sum := payload.ApplyOutput(pol, out, "")
	return v, sum, map[string]string{"output": pol.Output}
}

// redactWorkflow applies each step's action redact paths to its input, so
// a workflow's secrets are redacted whatever the default mode.
func (b *Builder) redactWorkflow(wf map[string]any) any {
	out, _ := payload.Clone(wf).(map[string]any)
	steps, _ := out["steps"].([]any)
	for i, s := range steps {
		step, ok := s.(map[string]any)
		if !ok {
			continue
		}
		name, _ := step["action"].(string)
		pol, _ := b.action(name)
		if in, ok := step["input"]; ok {
			step["input"] = payload.Redact(in, pol.RedactPaths)
		}
		if k, ok := step["idempotencyKey"].(string); ok && k != "" {
			delete(step, "idempotencyKey")
			step["idempotencyKeyHash"] = sha(k)
		}
		steps[i] = step
	}
	return out
}

// Record size bounds. A record's encoding is bounded so that an append
// always fits the server's max payload: an event whose payload the policy
// keeps whole (an output in "full" mode, a long approval reason, data in
// msgpack that JSON escapes six-fold) must not make its run's chain
// unstorable, which would hold its consumer's acknowledgements, and the
// audit of every run behind it, for as long as the event is redelivered.
const (
	// DefaultMaxRecordBytes bounds one record's JSON encoding unless the
	// server's max payload asks for less (an eighth of it).
	DefaultMaxRecordBytes = 64 << 10
	// maxFieldBytes is what an oversized record keeps of each string.
	maxFieldBytes = 512
	// recordOverhead bounds what a record adds to the strings and the
	// payloads of its event: its own field names, ids, hashes and the
	// chain's seal.
	recordOverhead = 4 << 10
)

// ModeOversize marks, in a record's PayloadModes, each payload that was
// replaced by its hash because the record was over its size bound.
const ModeOversize = "hash (oversize)"

// Fit bounds rec's JSON encoding to limit bytes and returns its size (an
// upper bound when the record is far below the limit, known from the size
// of the event's data without encoding the record). An oversized record
// keeps its identity, kind and status: its payloads (input, output, error,
// policy) are replaced by their hash ({"hash": …, "bytes": …}, marked
// [ModeOversize]); then, if it is still over, each long string keeps its
// first bytes and the hash of the whole. A record is never dropped for
// its size: the chain still holds one record per stored event.
func Fit(rec *events.AuditRecorded, dataBytes, limit int) int {
	if est := 6*dataBytes + recordOverhead + len(rec.EventSubject) + len(rec.EventSource) + len(rec.EventID) + len(rec.EventType); est <= limit {
		return est // JSON escapes a byte to at most six
	}
	size := encodedSize(rec)
	if size <= limit {
		return size
	}
	for _, p := range []struct {
		name string
		v    *any
	}{{"input", &rec.Input}, {"output", &rec.Output}, {"error", &rec.Error}, {"policy", &rec.Policy}} {
		if *p.v == nil {
			continue
		}
		hashed := payload.Hash(*p.v) // as the hash mode records a payload
		hashed["bytes"] = encodedLen(*p.v)
		*p.v = hashed
		if rec.PayloadModes == nil {
			rec.PayloadModes = map[string]string{}
		}
		rec.PayloadModes[p.name] = ModeOversize
	}
	if size = encodedSize(rec); size <= limit {
		return size
	}
	for _, s := range []*string{&rec.Summary, &rec.OutputSummary, &rec.UserID, &rec.Action, &rec.Mode, &rec.Status,
		&rec.ExecutionID, &rec.StepID, &rec.EventID, &rec.EventType, &rec.EventSubject, &rec.EventSource} {
		*s = clipWithHash(*s)
	}
	for k, v := range rec.PayloadModes {
		if len(k) > maxFieldBytes {
			delete(rec.PayloadModes, k)
			continue
		}
		rec.PayloadModes[k] = clipWithHash(v)
	}
	return encodedSize(rec)
}

// encodedSize is the size of rec as the bus encodes it.
func encodedSize(rec *events.AuditRecorded) int { return encodedLen(rec) }

// encodedLen is the size of v's JSON encoding (the bus's), or MaxInt when
// it has none.
func encodedLen(v any) int {
	b, err := jsoncodec.Marshal(v)
	if err != nil {
		return math.MaxInt
	}
	return len(b)
}

// clipWithHash keeps s when it is short, else its first maxFieldBytes
// (whole runes) and the SHA-256 of all of it, so that the record still
// says what it was and no two different values read the same.
func clipWithHash(s string) string {
	if len(s) <= maxFieldBytes {
		return s
	}
	cut := maxFieldBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… [%d bytes, sha256 %s]", strings.ToValidUTF8(s[:cut], ""), len(s), sha(s))
}

// Stripped is what is kept of a record that could not be stored at all
// (its append was refused for good): the event it records, its kind and
// status, and why; no payload. The chain then still says that the event
// was stored and audited, instead of missing it.
func Stripped(rec events.AuditRecorded, cause error) events.AuditRecorded {
	out := events.AuditRecorded{RunID: rec.RunID, Tenant: rec.Tenant, EventID: clipWithHash(rec.EventID), EventType: clipWithHash(rec.EventType),
		EventSubject: clipWithHash(rec.EventSubject), EventSource: clipWithHash(rec.EventSource), EventTime: rec.EventTime,
		Kind: rec.Kind, Status: clipWithHash(rec.Status), PayloadHash: rec.PayloadHash, Source: rec.Source,
		Summary:      clipWithHash("record not storable: " + string(actionbus.CodeOf(cause))),
		PayloadModes: map[string]string{"record": "stripped"}}
	return out
}
