package client

import (
	"github.com/actionbus/actionbus/catalog"
	"github.com/actionbus/actionbus/events"
)

// The wire types a client reads, named here for convenience: each event
// type is an alias of the public package
// [github.com/actionbus/actionbus/events], whose documentation shows its
// fields (go doc github.com/actionbus/actionbus/events AuditRecorded).
// They are the data of the events documented in docs/events.md and
// schemas/.
type (
	// AuditRecord is one record of the audit stream
	// (io.actionbus.audit.recorded): minimized, hash-chained per run. It
	// is [events.AuditRecorded].
	AuditRecord = events.AuditRecorded
	// Skill is a bundled agent skill of the catalog: its SKILL.md front
	// matter (name, description, version, tools, handoff targets), its
	// instructions, and the pool whose executors host its tools. It is
	// [catalog.Skill].
	Skill = catalog.Skill
	// ApprovalContext is what an approval token signs: the approval id,
	// run, step, user, action, input hash, dry-run hash and expiry. It is
	// [events.ApprovalContext].
	ApprovalContext = events.ApprovalContext
	// Permission is an action's normalized permission metadata. It is
	// [catalog.NormalizedPermission].
	Permission = catalog.NormalizedPermission
	// RequestEvent is the data of a run.requested event: it is
	// [events.RunRequested].
	RequestEvent = events.RunRequested
	// Decision is one planner decision: action, plan, clarify or final. It
	// is [events.Decision].
	Decision = events.Decision
	// Observation is what the planner saw of one executed action. It is
	// [events.Observation].
	Observation = events.Observation
	// Budget bounds what a run's LLM calls may spend. It is
	// [events.Budget].
	Budget = events.Budget
	// Usage is what a run's LLM calls used, in all and by model. It is
	// [events.RunUsage].
	Usage = events.RunUsage
)
