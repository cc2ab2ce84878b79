// Package policy decides whether an action may run in a run: which action
// modes the run allows and what an action's mode requires.
//
// It decides; it does not execute, and it never looks at action input.
// Tiers, per-action policies, composable policies and approvals build on
// this package.
package policy

import (
	"slices"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
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

// CheckMode fails closed: an action whose mode the run does not allow is
// refused with mode_not_allowed; a mutate action, even when allowed, needs
// an approval (approval_required) that this version cannot grant yet.
func CheckMode(requested []string, action string, mode actions.Mode) *actionbus.Error {
	allowed := AllowedModes(requested)
	if !slices.Contains(allowed, mode) {
		return actionbus.Errorf(actionbus.CodeModeNotAllowed, "action %q has mode %s; the run allows %v", action, mode, allowed).
			WithDetail("action", action).WithDetail("mode", string(mode))
	}
	if mode == actions.ModeMutate {
		return actionbus.Errorf(actionbus.CodeApprovalRequired, "action %q mutates and needs an approval", action).
			WithDetail("action", action)
	}
	return nil
}
