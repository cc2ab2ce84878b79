// Package policy decides whether an action may run in a run: the modes the
// run allows, default tier policy, explicit per-action policy, composable
// restrictions (role, scope, custom Go functions), and the evaluation
// snapshot recorded for every decision. It also holds the approval model:
// approval contexts bound to a stable input hash and signed tokens.
//
// It decides; it does not execute, and it never reads approval state from
// action input.
package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/limits"
)

// DefaultAllowedModes are the modes a run may use unless it names others:
// everything but mutate.
var DefaultAllowedModes = []actions.Mode{actions.ModeRead, actions.ModeDraft, actions.ModeDryRun}

// AllowedModes returns the run's allowed modes, or the defaults when it
// names none.
func AllowedModes(requested []string) []actions.Mode {
	if len(requested) == 0 {
		return DefaultAllowedModes
	}
	out := make([]actions.Mode, 0, len(requested))
	for _, m := range requested {
		out = append(out, actions.Mode(m))
	}
	return out
}

// CheckMode refuses an action whose mode the run does not allow with
// mode_not_allowed. mutate must be named explicitly in the run request.
func CheckMode(requested []string, action string, mode actions.Mode) *actionbus.Error {
	allowed := AllowedModes(requested)
	if !slices.Contains(allowed, mode) {
		return actionbus.Errorf(actionbus.CodeModeNotAllowed, "action %q has mode %s; the run allows %v", action, mode, allowed).
			WithDetail("action", action).WithDetail("mode", string(mode))
	}
	return nil
}

// Effects of a policy decision.
const (
	Allow = "allow"
	Ask   = "ask"
	Deny  = "deny"
)

// Verdict is one policy's opinion. An empty Effect means no opinion.
type Verdict struct {
	Effect string `json:"action"`
	Reason string `json:"reason,omitempty"`
}

// Request is what a policy judges: one action call of a run.
type Request struct {
	Action     string
	Mode       actions.Mode
	Tier       int
	Permission actions.NormalizedPermission
	Origin     string
	UserID     string
	// Principal is who the run acts for, as authentication established
	// it: its roles and scopes are what RequireRole and RequireScope read.
	Principal Principal
	// Metadata is the run request's metadata, as its caller wrote it: it
	// never grants a role or scope.
	Metadata map[string]any
	// Via is the generic action the call came through (execute_skill_tool
	// for a skill tool): an explicit policy for Via applies when the
	// action has none of its own.
	Via string
}

// Policy is a composable rule. Built-ins and custom policies have this
// shape; return an empty Verdict for no opinion.
type Policy func(ctx context.Context, r Request) Verdict

// Compose runs policies in order: the first deny wins at once; otherwise
// any ask makes the result ask; otherwise any allow makes it allow;
// otherwise there is no opinion.
func Compose(ps ...Policy) Policy {
	return func(ctx context.Context, r Request) Verdict {
		var ask, allow *Verdict
		for _, p := range ps {
			v := p(ctx, r)
			switch v.Effect {
			case Deny:
				return v
			case Ask:
				if ask == nil {
					ask = &v
				}
			case Allow:
				if allow == nil {
					allow = &v
				}
			}
		}
		switch {
		case ask != nil:
			return *ask
		case allow != nil:
			return *allow
		}
		return Verdict{}
	}
}

// RequireRole denies unless the authenticated principal holds role.
func RequireRole(role string) Policy {
	return func(_ context.Context, r Request) Verdict {
		if slices.Contains(r.Principal.Roles, role) {
			return Verdict{}
		}
		return Verdict{Effect: Deny, Reason: fmt.Sprintf("requires role %q, which %s does not hold", role, r.Principal)}
	}
}

// RequireScope denies unless the authenticated principal holds scope.
func RequireScope(scope string) Policy {
	return func(_ context.Context, r Request) Verdict {
		if slices.Contains(r.Principal.Scopes, scope) {
			return Verdict{}
		}
		return Verdict{Effect: Deny, Reason: fmt.Sprintf("requires scope %q, which %s does not hold", scope, r.Principal)}
	}
}

// ForActions limits a policy to the named actions.
func ForActions(p Policy, names ...string) Policy {
	return func(ctx context.Context, r Request) Verdict {
		if slices.Contains(names, r.Action) {
			return p(ctx, r)
		}
		return Verdict{}
	}
}

// TierDefault is the seed's default: tier 0 allows, 1 and 2 ask, 3 denies.
func TierDefault(tier int) Verdict {
	switch {
	case tier <= 0:
		return Verdict{Effect: Allow, Reason: "tier 0"}
	case tier >= 3:
		return Verdict{Effect: Deny, Reason: "tier 3"}
	}
	return Verdict{Effect: Ask, Reason: fmt.Sprintf("tier %d", tier)}
}

// Explicit is per-action policy: action name to a verdict. In config it is
// a string ("allow", "ask", "deny") or an object {"action": ..., "reason":
// ...}; anything else is refused.
type Explicit map[string]Verdict

// UnmarshalJSON reads the string-or-object form and refuses unknown values.
func (e *Explicit) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	out := Explicit{}
	for name, v := range raw {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[name] = Verdict{Effect: s}
		} else {
			var obj struct {
				Action string `json:"action"`
				Reason string `json:"reason"`
			}
			dec := json.NewDecoder(strings.NewReader(string(v)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&obj); err != nil {
				return fmt.Errorf("policy for %q: want \"allow\", \"ask\", \"deny\" or {\"action\", \"reason\"}: %w", name, err)
			}
			out[name] = Verdict{Effect: obj.Action, Reason: obj.Reason}
		}
		switch out[name].Effect {
		case Allow, Ask, Deny:
		default:
			return fmt.Errorf("policy for %q: unknown value %q (want allow, ask or deny)", name, out[name].Effect)
		}
	}
	*e = out
	return nil
}

// Config is the operator's policy configuration, loaded at start (a file)
// and reloadable from the policy bucket.
type Config struct {
	// Actions is explicit per-action policy; it wins over tiers.
	Actions Explicit `json:"actions,omitempty"`
	// RequireRoles maps an action name ("*" for all) to a role the run's
	// authenticated principal must hold.
	RequireRoles map[string]string `json:"requireRoles,omitempty"`
	// RequireScopes maps an action name ("*" for all) to a scope the run's
	// authenticated principal must hold.
	RequireScopes map[string]string `json:"requireScopes,omitempty"`
	// Tenants grants roles and scopes to the NATS client users of a tenant,
	// by tenant: NATS confines each client user to its tenant's subjects,
	// so the tenant of a request's subject is the identity NATS
	// authenticated. A run requested through a gateway (the HTTP API, MCP)
	// holds instead the roles and scopes of the gateway's authenticated
	// user, which the gateway signs.
	Tenants map[string]Grants `json:"tenants,omitempty"`
	// Limits override actions' declared concurrency keys and rate limits,
	// by action name (docs/limits.md).
	Limits map[string]limits.Spec `json:"limits,omitempty"`
}

// Grants are the roles and scopes a principal holds.
type Grants struct {
	Roles  []string `json:"roles,omitempty"`
	Scopes []string `json:"scopes,omitempty"`
}

// Principal is who a run acts for, as authentication established it.
type Principal struct {
	// Tenant is the tenant of the run's request subject, which NATS
	// confines each client user to.
	Tenant string `json:"tenant,omitempty"`
	// Gateway names the key of the gateway that authenticated User and
	// signed its grants; empty when the run came straight from a NATS
	// client of Tenant.
	Gateway string `json:"gateway,omitempty"`
	// User is the gateway's authenticated user.
	User string `json:"user,omitempty"`
	Grants
}

// String names the principal for a refusal's reason.
func (p Principal) String() string {
	if p.Gateway != "" {
		return fmt.Sprintf("user %q (authenticated by %s)", p.User, p.Gateway)
	}
	return fmt.Sprintf("the NATS clients of tenant %q", p.Tenant)
}

// Resolve gives a principal the grants in force: a gateway's user keeps
// the grants its gateway signed; a tenant's NATS clients hold what
// Tenants grants their tenant now (so a reloaded policy applies).
func (c *Config) Resolve(p Principal) Principal {
	if p.Gateway != "" {
		return p
	}
	p.Grants = Grants{}
	if c != nil {
		p.Grants = c.Tenants[p.Tenant]
	}
	return p
}

// LimitFor returns the limit in force for an action: the policy's, else
// the declared one (nil: none).
func (c *Config) LimitFor(action string, declared *limits.Spec) limits.Spec {
	if c != nil {
		if s, ok := c.Limits[action]; ok {
			return s
		}
	}
	if declared == nil {
		return limits.Spec{}
	}
	return *declared
}

// ParseConfig reads a configuration document, refusing unknown fields and
// values.
func ParseConfig(b []byte) (*Config, error) {
	var c Config
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		if strings.Contains(err.Error(), `"roleKey"`) || strings.Contains(err.Error(), `"scopeKey"`) {
			return nil, fmt.Errorf("policy: roleKey and scopeKey are gone: roles and scopes come from authentication (tenants, gateway tokens), never from run metadata (docs/approvals.md): %w", err)
		}
		return nil, fmt.Errorf("policy: %w", err)
	}
	for name, l := range c.Limits {
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("policy: limits of %s: %w", name, err)
		}
	}
	return &c, nil
}

// Policies returns the configuration's restrictions as composable policies,
// in a stable order (roles, then scopes, by action name).
func (c *Config) Policies() []Policy {
	if c == nil {
		return nil
	}
	var out []Policy
	add := func(m map[string]string, mk func(string) Policy) {
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			p := mk(m[n])
			if n != "*" {
				p = ForActions(p, n)
			}
			out = append(out, p)
		}
	}
	add(c.RequireRoles, RequireRole)
	add(c.RequireScopes, RequireScope)
	return out
}

// Snapshot is the evaluation record kept for every policy decision:
// {action, actionName, tier, source, reason, permission}.
type Snapshot struct {
	Action     string                       `json:"action"`
	ActionName string                       `json:"actionName"`
	Tier       int                          `json:"tier"`
	Source     string                       `json:"source"`
	Reason     string                       `json:"reason"`
	Permission actions.NormalizedPermission `json:"permission"`
}

// Evaluator evaluates requests against a configuration and extra
// policies. It is safe for concurrent use if its fields are not changed
// after construction; swap whole evaluators to reload.
type Evaluator struct {
	Config *Config
	Extra  []Policy
}

// Trusted reports whether an action's metadata comes from the host or a
// built-in (registered in code): dynamic sources (e.g. mounted tools) are
// untrusted and fail closed to ask.
func Trusted(p actions.NormalizedPermission) bool {
	switch p.Source {
	case actions.SourceBuiltIn, actions.SourceHost, actions.SourceFallback:
		return true
	}
	return false
}

// Evaluate decides one request. Order: restrictions (configured roles and
// scopes, then extra policies) — a deny wins and an ask is kept; then the
// explicit per-action policy if any, else the tier default; untrusted
// metadata is at least ask; a mutate action always needs approval (ask)
// unless denied. The snapshot records the outcome and why.
func (ev *Evaluator) Evaluate(ctx context.Context, r Request) Snapshot {
	snap := Snapshot{ActionName: r.Action, Tier: r.Tier, Permission: r.Permission, Source: "tier"}
	var restrictions []Policy
	if ev != nil {
		restrictions = append(ev.Config.Policies(), ev.Extra...)
		r.Principal = ev.Config.Resolve(r.Principal)
	}
	restricted := Compose(restrictions...)(ctx, r)
	if restricted.Effect == Deny {
		snap.Action, snap.Reason, snap.Source = Deny, restricted.Reason, "policy"
		return snap
	}
	v := TierDefault(r.Tier)
	if ev != nil && ev.Config != nil {
		ex, ok := ev.Config.Actions[r.Action]
		if !ok && r.Via != "" {
			ex, ok = ev.Config.Actions[r.Via]
		}
		if ok {
			v = ex
			snap.Source = "explicit"
			if v.Reason == "" {
				v.Reason = "explicit " + v.Effect
			}
		}
	}
	if restricted.Effect == Ask && v.Effect == Allow {
		v, snap.Source = restricted, "policy"
	}
	if !Trusted(r.Permission) && v.Effect == Allow {
		v, snap.Source = Verdict{Effect: Ask, Reason: "untrusted metadata (source " + r.Permission.Source + ") fails closed to ask"}, "judge"
	}
	if v.Effect != Deny && (r.Mode == actions.ModeMutate || r.Permission.NeedsApproval) && v.Effect == Allow {
		v, snap.Source = Verdict{Effect: Ask, Reason: "needs approval (" + string(r.Mode) + ")"}, "permission"
	}
	snap.Action, snap.Reason = v.Effect, v.Reason
	return snap
}
