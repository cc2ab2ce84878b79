package events

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Entry describes one event type of the catalog.
type Entry struct {
	// Type is the CloudEvent type.
	Type string
	// Subject is the subject pattern, with {prefix}, {tenant}, {runId} and
	// {pool} placeholders.
	Subject string
	// Producer is the service that publishes the event.
	Producer string
	// Consumers are the services that consume it.
	Consumers []string
	// Schema is the file name of the data schema in schemas/.
	Schema string
	// New returns a pointer to a zero value of the event's data struct.
	New func() any
	// Live marks an event published on core NATS only: followers see it
	// as it happens, no stream stores it and the auditor never sees it
	// (progress that recovery and the audit trail do not need).
	Live bool
}

// Catalog is the single list of event types. docs/events.md documents the
// same list; TestCatalogMatchesDocs keeps both in step.
var Catalog = []Entry{
	{TypeRunRequested, "{prefix}.run.{tenant}.{runId}.requested", "client", []string{"dispatcher", "auditor"}, "run.requested.json", func() any { return new(RunRequested) }, false},
	{TypeRunStarted, "{prefix}.run.{tenant}.{runId}.started", "dispatcher", []string{"client"}, "run.started.json", func() any { return new(RunStarted) }, true},
	{TypeRunStep, "{prefix}.run.{tenant}.{runId}.step", "dispatcher", []string{"auditor", "client"}, "run.step.json", func() any { return new(RunStep) }, false},
	{TypeRunProgress, "{prefix}.run.{tenant}.{runId}.progress", "dispatcher", []string{"client"}, "run.progress.json", func() any { return new(RunProgress) }, true},
	{TypeRunCompleted, "{prefix}.run.{tenant}.{runId}.completed", "dispatcher", []string{"auditor", "client"}, "run.completed.json", func() any { return new(RunCompleted) }, false},
	{TypeRunFailed, "{prefix}.run.{tenant}.{runId}.failed", "dispatcher", []string{"auditor", "client"}, "run.failed.json", func() any { return new(RunFailed) }, false},
	{TypeRunCanceled, "{prefix}.run.{tenant}.{runId}.canceled", "dispatcher", []string{"auditor", "client"}, "run.canceled.json", func() any { return new(RunCanceled) }, false},
	{TypeCancelRequested, "{prefix}.run.{tenant}.{runId}.cancel", "client", []string{"dispatcher", "auditor"}, "cancel.requested.json", func() any { return new(CancelRequested) }, false},
	{TypeDecisionRequested, "{prefix}.run.{tenant}.{runId}.decide", "dispatcher", []string{"planner", "auditor"}, "decision.requested.json", func() any { return new(DecisionRequested) }, false},
	{TypeDecisionMade, "{prefix}.run.{tenant}.{runId}.decision", "planner", []string{"dispatcher", "auditor"}, "decision.made.json", func() any { return new(DecisionMade) }, false},
	{TypeActionRequested, "{prefix}.pool.{pool}.request", "dispatcher", []string{"executor", "auditor"}, "action.requested.json", func() any { return new(ActionRequested) }, false},
	{TypeActionCompleted, "{prefix}.run.{tenant}.{runId}.result", "executor", []string{"dispatcher", "auditor"}, "action.completed.json", func() any { return new(ActionCompleted) }, false},
	{TypeActionFailed, "{prefix}.run.{tenant}.{runId}.result", "executor", []string{"dispatcher", "auditor"}, "action.failed.json", func() any { return new(ActionFailed) }, false},
	{TypeEventRejected, "{prefix}.rejected.{stream}", "any consumer", []string{"auditor", "operators"}, "event.rejected.json", func() any { return new(EventRejected) }, false},
	{TypeAuditRecorded, "{prefix}.audit.{tenant}.{runId}.{kind}", "auditor (before batching; still read)", []string{"operators"}, "audit.recorded.json", func() any { return new(AuditRecorded) }, false},
	{TypeAuditAppended, "{prefix}.audit.{tenant}.{runId}.records", "auditor", []string{"operators"}, "audit.appended.json", func() any { return new(AuditAppended) }, false},
	{TypeInputProvided, "{prefix}.run.{tenant}.{runId}.input", "client", []string{"dispatcher", "auditor"}, "input.provided.json", func() any { return new(InputProvided) }, false},
	{TypeTimerFired, "{prefix}.run.{tenant}.{runId}.timer", "dispatcher (scheduled)", []string{"dispatcher", "auditor"}, "timer.fired.json", func() any { return new(TimerFired) }, false},
	{TypeApprovalRequested, "{prefix}.run.{tenant}.{runId}.approval", "dispatcher", []string{"approvers", "auditor"}, "approval.requested.json", func() any { return new(ApprovalRequested) }, false},
	{TypeApprovalGranted, "{prefix}.run.{tenant}.{runId}.approve", "approver", []string{"dispatcher", "auditor"}, "approval.granted.json", func() any { return new(ApprovalGranted) }, false},
	{TypeApprovalDenied, "{prefix}.run.{tenant}.{runId}.deny", "approver", []string{"dispatcher", "auditor"}, "approval.denied.json", func() any { return new(ApprovalDenied) }, false},
	{TypeApprovalResolved, "{prefix}.run.{tenant}.{runId}.approval", "dispatcher", []string{"approvers", "auditor"}, "approval.resolved.json", func() any { return new(ApprovalResolved) }, false},
	{TypeSynthesisRequested, "{prefix}.run.{tenant}.{runId}.synthesize", "dispatcher", []string{"planner", "auditor"}, "synthesis.requested.json", func() any { return new(SynthesisRequested) }, false},
	{TypeSynthesisCompleted, "{prefix}.run.{tenant}.{runId}.synthesized", "planner", []string{"dispatcher", "auditor"}, "synthesis.completed.json", func() any { return new(SynthesisCompleted) }, false},
	{TypePoolAnnounced, "{prefix}.pool.{pool}.announce", "executor", []string{"dispatcher (registrar)"}, "pool.announced.json", func() any { return new(PoolAnnounced) }, true},
}

var catalogByType = func() map[string]*Entry {
	m := make(map[string]*Entry, len(Catalog))
	for i := range Catalog {
		m[Catalog[i].Type] = &Catalog[i]
	}
	return m
}()

// Lookup returns the catalog entry of an event type.
func Lookup(eventType string) (*Entry, bool) {
	e, ok := catalogByType[eventType]
	return e, ok
}

// Subjects builds the subjects of one deployment from its prefix.
// The zero value is not usable; use [NewSubjects].
type Subjects struct {
	prefix string
}

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = "ab"

// NewSubjects returns the subjects under prefix ("" means [DefaultPrefix]).
// The prefix must be a valid sequence of NATS subject tokens without
// wildcards.
func NewSubjects(prefix string) (Subjects, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, tok := range strings.Split(prefix, ".") {
		if !validToken(tok) {
			return Subjects{}, fmt.Errorf("events: invalid subject prefix %q", prefix)
		}
	}
	return Subjects{prefix: prefix}, nil
}

// MustSubjects is NewSubjects that panics on an invalid prefix; for
// constants and tests.
func MustSubjects(prefix string) Subjects {
	s, err := NewSubjects(prefix)
	if err != nil {
		panic(err)
	}
	return s
}

// validToken reports whether tok can be one subject token: non-empty, no
// wildcards, whitespace or dots.
func validToken(tok string) bool {
	if tok == "" {
		return false
	}
	for _, r := range tok {
		if r <= ' ' || r == '*' || r == '>' || r == '.' || r == 0x7f {
			return false
		}
	}
	return true
}

// Prefix returns the subject prefix.
func (s Subjects) Prefix() string { return s.prefix }

// Run returns the subject of a per-run event:
// {prefix}.run.{tenant}.{runId}.{verb}.
func (s Subjects) Run(tenant, runID, verb string) string {
	return s.prefix + ".run." + tenant + "." + runID + "." + verb
}

// Stored run events carry one token more than the subject they were
// published on: the run's partition, {prefix}.run.{tenant}.{runId}.{verb}.{partition},
// appended by the streams' subject transform (the server's
// partition(), over the run id token), so that each partition's events
// can be consumed by one dispatcher ([Subjects.InPartition]). Publishers
// and core NATS subscribers see the five-token subject; readers of a
// stream filter with [Subjects.StoredRun] or [Subjects.StoredAnyRun] and
// read a stored subject back with [Subjects.Canonical].

// StoredRun returns the filter of one run's stored events of verb, in
// whatever partition: {prefix}.run.{tenant}.{runId}.{verb}.*.
func (s Subjects) StoredRun(tenant, runID, verb string) string {
	return s.Run(tenant, runID, verb) + ".*"
}

// StoredForms returns the filters of one run's stored events of verb in
// both forms a stream may hold within its retention: under a partition
// ([Subjects.StoredRun]) and as published (stored by a release before
// partitions). Readers of a run's history read both.
func (s Subjects) StoredForms(tenant, runID, verb string) []string {
	return []string{s.Run(tenant, runID, verb), s.StoredRun(tenant, runID, verb)}
}

// StoredAnyRun returns the filter of every run's stored events of verb.
func (s Subjects) StoredAnyRun(verb string) string { return s.AnyRun(verb) + ".*" }

// Fence returns the subject of a partition's fence in the runs stream:
// {prefix}.fence.{partition}. The dispatcher that takes a partition
// publishes there first, and every run end it publishes expects the
// fence's last sequence to be its own (the server checks it), so a
// dispatcher that lost the partition while paused cannot publish an end
// after its successor started. No service consumes it.
func (s Subjects) Fence(partition int) string {
	return s.prefix + ".fence." + strconv.Itoa(partition)
}

// Fences is the filter of every partition's fence.
func (s Subjects) Fences() string { return s.prefix + ".fence.*" }

// InPartition returns the filter of the stored events of verb of the runs
// of one partition.
func (s Subjects) InPartition(verb string, partition int) string {
	return s.AnyRun(verb) + "." + strconv.Itoa(partition)
}

// Canonical returns the subject a stored run event was published on: a
// stored subject without its partition token. Any other subject, a
// schedule's among them, is returned as it is.
func (s Subjects) Canonical(subject string) string {
	rest, ok := strings.CutPrefix(subject, s.prefix+".run.")
	if !ok {
		return subject
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 || strings.Count(rest, ".") != 3 || !allDigits(rest[i+1:]) {
		return subject
	}
	if verb := rest[strings.LastIndexByte(rest[:i], '.')+1 : i]; verb == scheduleVerb {
		return subject
	}
	return subject[:len(subject)-len(rest)+i]
}

func allDigits(tok string) bool {
	if tok == "" || len(tok) > 4 {
		return false
	}
	for _, r := range tok {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// scheduleVerb is the fifth token of a schedule's subject ([Subjects.Schedule]).
const scheduleVerb = "sched"

// Schedule returns the subject of one of a run's timer schedules:
// {prefix}.run.{tenant}.{runId}.sched.{name}. A new schedule on the same
// subject replaces the previous one. Schedule subjects have one token more
// than published run events; the fifth token, "sched", keeps them out of
// every filter of stored run events, which names a verb.
func (s Subjects) Schedule(tenant, runID, name string) string {
	return s.prefix + ".run." + tenant + "." + runID + "." + scheduleVerb + "." + name
}

// Stream returns the core NATS subject on which a run's final answer is
// streamed while it is written: {prefix}.stream.{tenant}.{runId}. It is
// outside every stream, so tokens are neither stored nor audited.
func (s Subjects) Stream(tenant, runID string) string {
	return s.prefix + ".stream." + tenant + "." + runID
}

// Stream message headers. Tokens of a final answer are published on core
// NATS at [Subjects.Stream]: the body is the text, StreamSeqHeader numbers
// the messages from 1, and a message with StreamEndHeader ends the
// answer. They are not events: not stored, not audited, and lost if nobody
// listens; the run's terminal event carries the whole answer.
const (
	StreamSeqHeader = "Ab-Stream-Seq"
	StreamEndHeader = "Ab-Stream-End"
)

// AllRuns matches every per-run event.
func (s Subjects) AllRuns() string { return s.prefix + ".run.>" }

// requestProducers publish into the requests stream: what they write
// stays out of the duplicate window of what services write.
var requestProducers = map[string]bool{"client": true, "approver": true}

// requestVerbs are the per-run subject verbs that clients and approvers
// publish (run requests, cancels, inputs, approvals' answers), from the
// catalog.
func requestVerbs() []string { return runVerbs(true) }

// serviceVerbs are the per-run subject verbs that services publish, from
// the catalog.
func serviceVerbs() []string { return runVerbs(false) }

func runVerbs(requests bool) []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range Catalog {
		verb, ok := strings.CutPrefix(e.Subject, "{prefix}.run.{tenant}.{runId}.")
		if !ok || e.Live || seen[verb] || requestProducers[e.Producer] != requests {
			continue
		}
		seen[verb] = true
		out = append(out, verb)
	}
	return out
}

// RequestSubjects are the subjects clients and approvers publish to (one
// filter per request verb), which the ingress serves, and the subjects
// their events are stored under in the requests stream (the stream's
// subject transform maps [Subjects.Ingested] back to them), which the
// dispatcher's, the auditor's and the read service's filters name.
func (s Subjects) RequestSubjects() []string {
	var out []string
	for _, v := range requestVerbs() {
		out = append(out, s.AnyRun(v))
	}
	return out
}

// Ingested returns the services-only subject under which the ingress
// writes a tenant's request into the requests stream:
// {prefix}.ingress.{tenant}.{runId}.{verb}. No tenant account imports it,
// so only the ingress (the dispatcher's user) writes the stream; the
// stream stores the event under [Subjects.Run] of the same tokens.
func (s Subjects) Ingested(tenant, runID, verb string) string {
	return s.prefix + ".ingress." + tenant + "." + runID + "." + verb
}

// IngestedSubjects are the subjects the requests stream captures: the
// [Subjects.Ingested] form of every request verb.
func (s Subjects) IngestedSubjects() []string {
	var out []string
	for _, v := range requestVerbs() {
		out = append(out, s.Ingested("*", "*", v))
	}
	return out
}

// RequestFromSubject returns the tenant, run and verb tokens of a request
// subject ([Subjects.RequestSubjects]: five tokens, a request verb), and
// false for any other subject. The tokens are not validated further.
func (s Subjects) RequestFromSubject(subject string) (tenant, runID, verb string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.prefix+".run.")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || !slices.Contains(requestVerbs(), parts[2]) {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// ServiceRunSubjects are the subjects of the runs stream: every per-run
// verb services publish but the timers' ([Subjects.TimerSubjects]).
func (s Subjects) ServiceRunSubjects() []string {
	var out []string
	for _, v := range serviceVerbs() {
		if v != TimerVerb {
			out = append(out, s.AnyRun(v))
		}
	}
	return out
}

// RequestedVerb is the verb of run.requested, the event that starts a run.
const RequestedVerb = "requested"

// TimerVerb is the verb of timer.fired, the event the server writes when
// a timer schedule falls due.
const TimerVerb = "timer"

// TimerSubjects are the subjects of the timers stream: the run's timer
// schedules and the timer.fired events the server writes from them.
func (s Subjects) TimerSubjects() []string {
	return []string{s.AnyRun(TimerVerb), s.prefix + ".run.*.*.sched.*"}
}

// RunEvents matches every event of one run.
func (s Subjects) RunEvents(tenant, runID string) string {
	return s.prefix + ".run." + tenant + "." + runID + ".>"
}

// TenantRuns matches every per-run subject of one tenant; NATS
// permissions confine a tenant's users to it.
func (s Subjects) TenantRuns(tenant string) string { return s.prefix + ".run." + tenant + ".>" }

// AnyRun returns the filter for one verb across all runs of all tenants.
func (s Subjects) AnyRun(verb string) string { return s.prefix + ".run.*.*." + verb }

// PoolRequest returns the work subject of an executor pool.
func (s Subjects) PoolRequest(pool string) string { return s.prefix + ".pool." + pool + ".request" }

// PoolEnded is the subject on which the dispatcher tells a pool's
// executors that a run with calls on the pool ended (core NATS; the
// data is the run id, nothing of the run): they stop its running calls
// and answer its queued ones run_ended.
func (s Subjects) PoolEnded(pool string) string { return s.prefix + ".pool." + pool + ".ended" }

// Announce returns the subject on which a pool's executors announce their
// actions and skills to the registrar (request/reply, core NATS).
func (s Subjects) Announce(pool string) string { return s.prefix + ".pool." + pool + ".announce" }

// AllAnnounce matches every pool's announce subject.
func (s Subjects) AllAnnounce() string { return s.prefix + ".pool.*.announce" }

// PoolFromAnnounce returns the pool token of an announce subject, or "".
func (s Subjects) PoolFromAnnounce(subject string) string {
	rest, ok := strings.CutPrefix(subject, s.prefix+".pool.")
	if !ok {
		return ""
	}
	pool, ok := strings.CutSuffix(rest, ".announce")
	if !ok || !ValidPool(pool) {
		return ""
	}
	return pool
}

// AllPools matches the work subjects of every pool.
func (s Subjects) AllPools() string { return s.prefix + ".pool.*.request" }

// Rejected returns the rejected-events subject for events read from stream.
func (s Subjects) Rejected(stream string) string { return s.prefix + ".rejected." + stream }

// AllRejected matches every rejected-events subject.
func (s Subjects) AllRejected() string { return s.prefix + ".rejected.>" }

// Audit returns the audit subject of one run's records of one kind:
// {prefix}.audit.{tenant}.{runId}.{kind}.
func (s Subjects) Audit(tenant, runID, kind string) string {
	return s.prefix + ".audit." + tenant + "." + runID + "." + kind
}

// AuditAppend returns the subject of one run's audit appends
// (audit.appended): {prefix}.audit.{tenant}.{runId}.records.
func (s Subjects) AuditAppend(tenant, runID string) string {
	return s.prefix + ".audit." + tenant + "." + runID + ".records"
}

// RunAudit matches every audit record of one run.
func (s Subjects) RunAudit(tenant, runID string) string {
	return s.prefix + ".audit." + tenant + "." + runID + ".*"
}

// TenantAudit matches every audit record of one tenant's runs.
func (s Subjects) TenantAudit(tenant string) string { return s.prefix + ".audit." + tenant + ".>" }

// AllAudit matches the audit subjects of every run.
func (s Subjects) AllAudit() string { return s.prefix + ".audit.*.*.*" }

// RunIDFromSubject returns the run id of a per-run subject, or "" when the
// subject is not one.
func (s Subjects) RunIDFromSubject(subject string) string {
	_, id := s.RunFromSubject(subject)
	return id
}

// RunFromSubject returns the tenant and run id tokens of a per-run
// subject, or two empty strings when the subject is not one.
func (s Subjects) RunFromSubject(subject string) (tenant, runID string) {
	rest, ok := strings.CutPrefix(subject, s.prefix+".run.")
	if !ok {
		return "", ""
	}
	parts := strings.SplitN(rest, ".", 3)
	if len(parts) < 3 {
		return "", ""
	}
	return parts[0], parts[1]
}

// SubjectFor returns the subject an event of eventType is published on.
// tenant, runID and pool fill the placeholders the type needs.
func (s Subjects) SubjectFor(eventType, tenant, runID, pool string) (string, error) {
	if eventType != TypeActionRequested && eventType != TypeEventRejected && eventType != TypeAuditRecorded && eventType != TypeAuditAppended &&
		eventType != TypePoolAnnounced {
		if err := CheckTenant(tenant); err != nil {
			return "", err
		}
	}
	switch eventType {
	case TypeRunRequested:
		return s.Run(tenant, runID, RequestedVerb), nil
	case TypeRunStarted:
		return s.Run(tenant, runID, "started"), nil
	case TypeRunStep:
		return s.Run(tenant, runID, "step"), nil
	case TypeRunProgress:
		return s.Run(tenant, runID, "progress"), nil
	case TypeRunCompleted:
		return s.Run(tenant, runID, "completed"), nil
	case TypeRunFailed:
		return s.Run(tenant, runID, "failed"), nil
	case TypeRunCanceled:
		return s.Run(tenant, runID, "canceled"), nil
	case TypeCancelRequested:
		return s.Run(tenant, runID, "cancel"), nil
	case TypeDecisionRequested:
		return s.Run(tenant, runID, "decide"), nil
	case TypeDecisionMade:
		return s.Run(tenant, runID, "decision"), nil
	case TypeActionRequested:
		return s.PoolRequest(pool), nil
	case TypePoolAnnounced:
		return s.Announce(pool), nil
	case TypeActionCompleted, TypeActionFailed:
		return s.Run(tenant, runID, "result"), nil
	case TypeAuditRecorded, TypeAuditAppended:
		return "", fmt.Errorf("events: audit records are published by the auditor on Subjects.AuditAppend(tenant, runId)")
	case TypeInputProvided:
		return s.Run(tenant, runID, "input"), nil
	case TypeTimerFired:
		return s.Run(tenant, runID, "timer"), nil
	case TypeApprovalRequested, TypeApprovalResolved:
		return s.Run(tenant, runID, "approval"), nil
	case TypeApprovalGranted:
		return s.Run(tenant, runID, "approve"), nil
	case TypeApprovalDenied:
		return s.Run(tenant, runID, "deny"), nil
	case TypeSynthesisRequested:
		return s.Run(tenant, runID, "synthesize"), nil
	case TypeSynthesisCompleted:
		return s.Run(tenant, runID, "synthesized"), nil
	}
	return "", fmt.Errorf("events: no subject rule for type %q", eventType)
}

// API returns the subject of one operation of the read service for a
// tenant: {prefix}.api.{tenant}.{op}. The tenant token is the only place
// the read service learns the asking tenant from (a tenant account's
// import of the service fixes it).
func (s Subjects) API(tenant, op string) string { return s.prefix + ".api." + tenant + "." + op }

// AnyAPI matches one read service operation for every tenant:
// {prefix}.api.*.{op}.
func (s Subjects) AnyAPI(op string) string { return s.prefix + ".api.*." + op }

// APIFromSubject returns the tenant and operation tokens of a read
// service subject, and false when the subject is not one.
func (s Subjects) APIFromSubject(subject string) (tenant, op string, ok bool) {
	rest, ok := strings.CutPrefix(subject, s.prefix+".api.")
	if !ok {
		return "", "", false
	}
	tenant, op, ok = strings.Cut(rest, ".")
	if !ok || tenant == "" || op == "" || strings.Contains(op, ".") {
		return "", "", false
	}
	return tenant, op, true
}

// IsRequestVerb reports whether verb is a per-run verb stored in the
// requests stream (what clients and approvers publish).
func IsRequestVerb(verb string) bool { return slicesContains(requestVerbs(), verb) }

// IsServiceVerb reports whether verb is a per-run verb stored in the runs
// stream (what services publish, the timers' excepted).
func IsServiceVerb(verb string) bool {
	return verb != TimerVerb && slicesContains(serviceVerbs(), verb)
}

func slicesContains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// ValidPool reports whether pool is a valid pool name: 1 to 64 letters,
// digits, '_' or '-' (a subject token and part of bucket names).
func ValidPool(pool string) bool {
	if pool == "" || len(pool) > 64 {
		return false
	}
	for _, r := range pool {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// Extension attribute names used by actionbus.
const (
	ExtRunID     = "runid"
	ExtCycle     = "cycle"
	ExtPlanIndex = "planindex"
	ExtAttempt   = "attempt"
	ExtPool      = "pool"
)
