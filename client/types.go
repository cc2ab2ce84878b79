package client

import (
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/skills"
)

// The wire types a client reads, named here so that code outside the
// module can name them (they are the data of the events documented in
// docs/events.md and schemas/).
type (
	// AuditRecord is one record of the audit stream
	// (io.actionbus.audit.recorded): minimized, hash-chained per run.
	AuditRecord = events.AuditRecorded
	// Skill is a bundled agent skill of the catalog: its SKILL.md front
	// matter (name, description, version, tools, handoff targets), its
	// instructions, and the pool whose executors host its tools.
	Skill = skills.Skill
	// ApprovalContext is what an approval token signs: the approval id,
	// run, step, user, action, input hash, dry-run hash and expiry.
	ApprovalContext = events.ApprovalContext
	// Permission is an action's normalized permission metadata.
	Permission = actions.NormalizedPermission
	// RequestEvent is the data of a run.requested event.
	RequestEvent = events.RunRequested
	// Decision is one planner decision: action, plan, clarify or final.
	Decision = events.Decision
	// Observation is what the planner saw of one executed action.
	Observation = events.Observation
)
