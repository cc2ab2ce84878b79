package catalog

import (
	"fmt"
	"slices"
	"strings"

	"github.com/actionbus/actionbus"
)

// Mode says what an action does to the world.
type Mode string

// The action modes.
const (
	ModeRead   Mode = "read"
	ModeDraft  Mode = "draft"
	ModeDryRun Mode = "dryRun"
	ModeMutate Mode = "mutate"
)

// Valid reports whether m is one of the four modes.
func (m Mode) Valid() bool {
	switch m {
	case ModeRead, ModeDraft, ModeDryRun, ModeMutate:
		return true
	}
	return false
}

// PlannerMeta is what planners see of an action beyond its name,
// description and input schema.
type PlannerMeta struct {
	// Hidden keeps the action out of the planner-visible listing
	// (the seed's planner: false). Hidden actions can still run from
	// workflows and exec.
	Hidden bool `json:"hidden,omitempty"`
	// Aliases are other names planners may use for the action (planner
	// repair: "search" → "web_search").
	Aliases []string `json:"aliases,omitempty"`
	// ArgsExample is a JSON example of the input for planner prompts.
	ArgsExample any `json:"argsExample,omitempty"`
	// DecisionType is the envelope kind the action answers, usually
	// "action" or "clarify"; default "action".
	DecisionType string `json:"decisionType,omitempty"`
	// Guidance says when the action should be chosen.
	Guidance string `json:"guidance,omitempty"`
	// ArgsSchemaOptOut is the reason a planner-visible action has no input
	// schema; required in that case.
	ArgsSchemaOptOut string `json:"argsSchemaOptOut,omitempty"`
	// StateMutator marks an action that changes planner state (like the
	// seed's read_agent_skill): it must run alone, never inside a plan.
	StateMutator bool `json:"stateMutator,omitempty"`
}

// Permission is what an action may do to the world, as declared by its
// author. Nil fields are filled by [Permission.Normalize] with conservative
// fallbacks.
type Permission struct {
	// Effect is the kind of side effect: "none", "read_state",
	// "write_state", "external_network", "filesystem", ...
	Effect string `json:"effect,omitempty"`
	// InterruptBehavior is "abort_safe" (canceling mid-way leaves no
	// partial effect) or "block" (let it finish).
	InterruptBehavior string `json:"interruptBehavior,omitempty"`
	// ConcurrencySafe says the action may run beside others of its run.
	ConcurrencySafe *bool `json:"isConcurrencySafe,omitempty"`
	// Destructive says the action removes or overwrites state.
	Destructive *bool `json:"isDestructive,omitempty"`
	// ReadOnly says the action changes nothing.
	ReadOnly *bool `json:"isReadOnly,omitempty"`
	// NeedsApproval says a human must approve each call.
	NeedsApproval *bool `json:"needsApproval,omitempty"`
	// Source says where the metadata came from: "built_in_metadata",
	// "host_metadata", or "fallback" when it was derived.
	Source string `json:"source,omitempty"`
}

// NormalizedPermission is a permission with every field decided.
type NormalizedPermission struct {
	Effect            string `json:"effect"`
	InterruptBehavior string `json:"interruptBehavior"`
	ConcurrencySafe   bool   `json:"isConcurrencySafe"`
	Destructive       bool   `json:"isDestructive"`
	ReadOnly          bool   `json:"isReadOnly"`
	NeedsApproval     bool   `json:"needsApproval"`
	Source            string `json:"source"`
}

// Permission sources.
const (
	SourceBuiltIn  = "built_in_metadata"
	SourceHost     = "host_metadata"
	SourceFallback = "fallback"
)

// Normalize decides every field, falling back conservatively: a missing
// field never makes an action look safer than its mode says. Only read
// actions are read-only and concurrency-safe by default; mutate actions
// are destructive and need approval by default; the interrupt behaviour
// defaults to "block" (do not assume a half-done action can be abandoned).
// Declared values that contradict the mode in the unsafe direction win
// (a read action declared destructive is destructive); declared values
// that would make a mutate action look safe do not (a mutate action always
// needs approval).
func (p *Permission) Normalize(mode Mode) NormalizedPermission {
	var declared Permission
	if p != nil {
		declared = *p
	}
	n := NormalizedPermission{
		Effect:            declared.Effect,
		InterruptBehavior: declared.InterruptBehavior,
		Source:            declared.Source,
	}
	pick := func(v *bool, fallback bool) bool {
		if v == nil {
			return fallback
		}
		return *v
	}
	n.ReadOnly = pick(declared.ReadOnly, mode == ModeRead)
	n.ConcurrencySafe = pick(declared.ConcurrencySafe, mode == ModeRead)
	n.Destructive = pick(declared.Destructive, mode == ModeMutate)
	n.NeedsApproval = pick(declared.NeedsApproval, mode == ModeMutate)
	if mode == ModeMutate {
		n.ReadOnly = false
		n.NeedsApproval = true
	}
	if n.Effect == "" {
		switch mode {
		case ModeRead, ModeDryRun:
			n.Effect = "read_state"
		case ModeDraft:
			n.Effect = "draft"
		default:
			n.Effect = "write_state"
		}
	}
	if n.InterruptBehavior == "" {
		n.InterruptBehavior = "block"
	}
	complete := p != nil && p.Effect != "" && p.InterruptBehavior != "" && p.ConcurrencySafe != nil &&
		p.Destructive != nil && p.ReadOnly != nil && p.NeedsApproval != nil
	switch {
	case n.Source == "" && complete:
		n.Source = SourceHost
	case n.Source == "":
		n.Source = SourceFallback
	}
	return n
}

// Example is a documented use of an action.
type Example struct {
	Title string `json:"title"`
	Input any    `json:"input"`
}

// Payload modes of an audit policy.
const (
	PayloadFull     = "full"
	PayloadRedacted = "redacted"
	PayloadHash     = "hash"
	PayloadSummary  = "summary"
	PayloadOmit     = "omit"
)

// AuditPolicy says how much of an action's input, output and error the
// audit stream keeps (see internal/audit for how each mode is applied).
type AuditPolicy struct {
	// Input is full, redacted, hash or omit; Output is full, redacted,
	// summary, hash or omit; Error is full, redacted, summary or omit.
	// Empty means the auditor's default.
	Input  string `json:"input,omitempty"`
	Output string `json:"output,omitempty"`
	Error  string `json:"error,omitempty"`
	// RedactPaths are exact JSON Pointers (RFC 6901, "~0" and "~1"
	// escapes) redacted in every mode that keeps or hashes a payload; ""
	// is the whole payload. A missing path is ignored.
	RedactPaths []string `json:"redactPaths,omitempty"`
}

// The payload modes each field accepts.
var auditModes = map[string][]string{
	"input":  {PayloadFull, PayloadRedacted, PayloadHash, PayloadOmit},
	"output": {PayloadFull, PayloadRedacted, PayloadSummary, PayloadHash, PayloadOmit},
	"error":  {PayloadFull, PayloadRedacted, PayloadSummary, PayloadOmit},
}

// Validate refuses unknown modes and paths that are not JSON Pointers
// with invalid_audit_policy.
func (a *AuditPolicy) Validate() error {
	if a == nil {
		return nil
	}
	for _, f := range []struct{ field, mode string }{{"input", a.Input}, {"output", a.Output}, {"error", a.Error}} {
		if f.mode != "" && !slices.Contains(auditModes[f.field], f.mode) {
			return actionbus.Errorf(actionbus.CodeInvalidAuditPolicy, "audit policy %s mode %q (want %s)", f.field, f.mode, strings.Join(auditModes[f.field], ", ")).
				WithDetail("path", "/auditPolicy/"+f.field)
		}
	}
	for i, p := range a.RedactPaths {
		if p != "" && !strings.HasPrefix(p, "/") {
			return actionbus.Errorf(actionbus.CodeInvalidAuditPolicy, "redactPaths[%d] %q is not a JSON Pointer (it must be \"\" or start with \"/\")", i, p).
				WithDetail("path", fmt.Sprintf("/auditPolicy/redactPaths/%d", i))
		}
		if strings.Contains(strings.ReplaceAll(strings.ReplaceAll(p, "~0", ""), "~1", ""), "~") {
			return actionbus.Errorf(actionbus.CodeInvalidAuditPolicy, "redactPaths[%d] %q has a \"~\" that is not \"~0\" or \"~1\"", i, p).
				WithDetail("path", fmt.Sprintf("/auditPolicy/redactPaths/%d", i))
		}
	}
	return nil
}
