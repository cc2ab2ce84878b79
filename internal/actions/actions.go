// Package actions defines what an action is: its definition (name, mode,
// tier, schemas, version), the handler contract ({Output, Summary,
// Complete} or an error), the in-process registry of one executor, and the
// shared catalog of every pool's definitions in a JetStream key-value
// bucket.
//
// It does not run actions (the executor package does) and does not decide
// whether an action may run (the policy package does).
package actions

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/catalog"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/canonical"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/schema"
)

// What an action declares, defined in the public package catalog (its
// documentation shows the fields); named here for the code that handles
// definitions.
type (
	Mode                 = catalog.Mode
	PlannerMeta          = catalog.PlannerMeta
	Permission           = catalog.Permission
	NormalizedPermission = catalog.NormalizedPermission
	Example              = catalog.Example
	AuditPolicy          = catalog.AuditPolicy
)

// The action modes, permission sources and audit payload modes (see
// package catalog).
const (
	ModeRead   = catalog.ModeRead
	ModeDraft  = catalog.ModeDraft
	ModeDryRun = catalog.ModeDryRun
	ModeMutate = catalog.ModeMutate

	SourceBuiltIn  = catalog.SourceBuiltIn
	SourceHost     = catalog.SourceHost
	SourceFallback = catalog.SourceFallback

	PayloadFull     = catalog.PayloadFull
	PayloadRedacted = catalog.PayloadRedacted
	PayloadHash     = catalog.PayloadHash
	PayloadSummary  = catalog.PayloadSummary
	PayloadOmit     = catalog.PayloadOmit
)

// riskLevels are the risk levels a definition may declare.
var riskLevels = map[string]bool{"": true, "low": true, "medium": true, "high": true, "critical": true}

// Definition describes one action. It is what executors publish to the
// catalog and what planners and the dispatcher read.
type Definition struct {
	// Name is unique per catalog; letters, digits, '.', '_' and '-'.
	Name string `json:"name"`
	// Description is a short planner-facing description.
	Description string `json:"description"`
	// Mode is read, draft, dryRun or mutate; default read.
	Mode Mode `json:"mode"`
	// Tier is the default policy tier, 0 (allow) to 3 (deny).
	Tier int `json:"tier"`
	// InputSchema is the JSON Schema of the input (the args schema).
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
	// OutputSchema is the JSON Schema of the output.
	OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
	// Version of the definition; default "1". Publishing another
	// definition under the same name and version is a conflict.
	Version string `json:"version"`
	// TimeoutMs bounds one execution; 0 means the executor's default.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// Pool is the executor pool that hosts the action.
	Pool string `json:"pool"`
	// Planner is the planner metadata; nil means visible with defaults.
	Planner *PlannerMeta `json:"planner,omitempty"`
	// DeclaredPermission is the permission metadata as the author gave
	// it; Permission is its normalized form (set by Normalize).
	DeclaredPermission *Permission          `json:"declaredPermission,omitempty"`
	Permission         NormalizedPermission `json:"permission"`
	// Tags, ResourceType, RiskLevel and Examples document the action for
	// hosts and API reuse.
	Tags         []string  `json:"tags,omitempty"`
	ResourceType string    `json:"resourceType,omitempty"`
	RiskLevel    string    `json:"riskLevel,omitempty"`
	Examples     []Example `json:"examples,omitempty"`
	// AuditPolicy says how much of input, output and error is audited.
	AuditPolicy *AuditPolicy `json:"auditPolicy,omitempty"`
	// HostOnlyKeys are input keys only the host may set: they are always
	// stripped from model-origin input.
	HostOnlyKeys []string `json:"hostOnlyKeys,omitempty"`
	// HealFlattenedInto names an object property of the input that
	// collects arguments a model flattened beside it (the seed's
	// execute_skill_tool auto-heal).
	HealFlattenedInto string `json:"healFlattenedInto,omitempty"`
	// Limits are the action's concurrency key and rate limit (overridable
	// by policy); nil limits nothing.
	Limits *limits.Spec `json:"limits,omitempty"`
	// Tenants are the tenants whose runs may call the action (its pool's
	// executors are dedicated to them); empty means every tenant.
	Tenants []string `json:"tenants,omitempty"`
}

// ServesTenant reports whether runs of tenant may call the action.
func (d *Definition) ServesTenant(tenant string) bool {
	return len(d.Tenants) == 0 || slices.Contains(d.Tenants, tenant)
}

// PlannerVisible reports whether planners may see and choose the action.
func (d *Definition) PlannerVisible() bool { return d.Planner == nil || !d.Planner.Hidden }

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Normalize fills defaults and validates the definition.
func (d *Definition) Normalize() error {
	if !namePattern.MatchString(d.Name) {
		return actionbus.Errorf(actionbus.CodeInvalidDefinition, "invalid action name %q (letters, digits, '.', '_', '-'; up to 128)", d.Name)
	}
	if d.Mode == "" {
		d.Mode = ModeRead
	}
	if !d.Mode.Valid() {
		return actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %s: unknown mode %q", d.Name, d.Mode)
	}
	if d.Tier < 0 || d.Tier > 3 {
		return actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %s: tier must be 0 to 3, got %d", d.Name, d.Tier)
	}
	if d.Version == "" {
		d.Version = "1"
	}
	invalid := func(format string, args ...any) error {
		return actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %s: "+format, append([]any{d.Name}, args...)...).WithDetail("action", d.Name)
	}
	for _, s := range []json.RawMessage{d.InputSchema, d.OutputSchema} {
		if len(s) == 0 {
			continue
		}
		if _, err := schema.CompileDocument("mem://"+d.Name, s); err != nil {
			return invalid("%v", err)
		}
	}
	if d.PlannerVisible() && len(d.InputSchema) == 0 && (d.Planner == nil || strings.TrimSpace(d.Planner.ArgsSchemaOptOut) == "") {
		return invalid("a planner-visible action needs an input schema or a non-empty ArgsSchemaOptOut reason")
	}
	if d.Planner != nil {
		switch d.Planner.DecisionType {
		case "", "action", "clarify":
		default:
			return invalid("planner decision type %q (want action or clarify)", d.Planner.DecisionType)
		}
		for _, a := range d.Planner.Aliases {
			if !namePattern.MatchString(a) {
				return invalid("planner alias %q is not a valid action name", a)
			}
		}
	}
	if !riskLevels[d.RiskLevel] {
		return invalid("risk level %q (want low, medium, high or critical)", d.RiskLevel)
	}
	if err := d.AuditPolicy.Validate(); err != nil {
		return err
	}
	if d.Limits != nil {
		if err := d.Limits.Validate(); err != nil {
			return invalid("%v", err)
		}
	}
	for _, k := range d.HostOnlyKeys {
		if k == "" {
			return invalid("empty host-only key")
		}
	}
	if d.HealFlattenedInto != "" {
		var s struct {
			Properties map[string]struct {
				Type any `json:"type"`
			} `json:"properties"`
		}
		_ = json.Unmarshal(d.InputSchema, &s)
		p, ok := s.Properties[d.HealFlattenedInto]
		if !ok || p.Type != "object" {
			return invalid("HealFlattenedInto %q must name an object property of the input schema", d.HealFlattenedInto)
		}
	}
	d.Permission = d.DeclaredPermission.Normalize(d.Mode)
	return nil
}

// Hash is the SHA-256 over the RFC 8785 canonical JSON of the definition:
// two executors publishing the same name and version must agree on it.
func (d Definition) Hash() string {
	h, err := canonical.Hash(d)
	if err != nil {
		panic(err) // a Definition always marshals
	}
	return h
}

// Call is one invocation of an action as a handler sees it.
type Call struct {
	RunID   string
	CallID  string
	Action  string
	UserID  string
	Origin  string
	Attempt int
	// Input is the validated input as JSON.
	Input json.RawMessage
	// IdempotencyKey is the call's idempotency key ("" when it has none).
	IdempotencyKey string
	// InputHash is the stable hash of the input (policy.InputHash).
	InputHash string
	// Approval is the call's verified approval, if it needed one.
	Approval *events.ApprovalGrant
	// PutArtifact stores data in the artifact store under an id derived
	// from the call and role; nil where there is no store.
	PutArtifact func(ctx context.Context, role, mediaType string, data []byte) (events.ArtifactRef, error)
}

// Result is what a handler returns: the output, a short summary for the
// run's history, and whether the action completes the run.
type Result struct {
	Output   any
	Summary  string
	Complete bool
}

// Handler runs one call. Its ctx is canceled when the call times out or the
// run is canceled.
type Handler func(ctx context.Context, call Call) (Result, error)

// Registered is a definition with its handler and compiled schemas.
type Registered struct {
	Def     Definition
	Handler Handler
	Args    *ArgsChecker
	output  *schema.Compiled
}

// ValidateOutput checks output against the output schema.
func (r *Registered) ValidateOutput(output []byte) error {
	if r.output == nil {
		return nil
	}
	return r.output.ValidateJSON(output)
}

// Registry holds the actions of one executor. It is safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	actions map[string]*Registered
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{actions: map[string]*Registered{}} }

// Register adds an action. Registering a name twice fails with
// action_already_registered.
func (r *Registry) Register(def Definition, h Handler) error {
	if h == nil {
		return fmt.Errorf("actions: %s: nil handler", def.Name)
	}
	if err := def.Normalize(); err != nil {
		return err
	}
	reg := &Registered{Def: def, Handler: h}
	var err error
	if reg.Args, err = NewArgsChecker(def); err != nil {
		return err
	}
	if len(def.OutputSchema) > 0 {
		if reg.output, err = schema.CompileDocument("mem://"+def.Name+"/output", def.OutputSchema); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.actions[def.Name]; dup {
		return actionbus.Errorf(actionbus.CodeActionAlreadyExists, "action %q is already registered", def.Name)
	}
	r.actions[def.Name] = reg
	return nil
}

// Remove removes an action; it reports whether it was registered.
func (r *Registry) Remove(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.actions[name]
	delete(r.actions, name)
	return ok
}

// Lookup returns a registered action.
func (r *Registry) Lookup(name string) (*Registered, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	a, ok := r.actions[name]
	return a, ok
}

// Definitions returns every definition, sorted by name.
func (r *Registry) Definitions() []Definition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Definition, 0, len(r.actions))
	for _, a := range r.actions {
		out = append(out, a.Def)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// DefaultTimeout bounds an action without its own timeout.
const DefaultTimeout = 30 * time.Second

// Timeout is the one rule for an action call's deadline, applied by the
// dispatcher when it admits a call and by the executor when it runs one:
// the action's own timeout (defMs) or, without one, fallback; a smaller
// timeout asked for by the call (callMs, e.g. a workflow step's) wins.
func Timeout(defMs, callMs int64, fallback time.Duration) time.Duration {
	t := fallback
	if defMs > 0 {
		t = time.Duration(defMs) * time.Millisecond
	}
	if callMs > 0 && time.Duration(callMs)*time.Millisecond < t {
		t = time.Duration(callMs) * time.Millisecond
	}
	return t
}

// ValidName reports whether name is a valid action name (letters, digits,
// '.', '_', '-'; up to 128, starting with a letter or digit).
func ValidName(name string) bool { return namePattern.MatchString(name) }
