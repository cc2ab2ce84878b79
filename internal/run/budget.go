package run

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// budget sets a new run's budget: the request's, capped by the host's
// run budget and its tenant's daily budget. A request for more than the
// host's run budget is refused.
func (m *Machine) budget(st *State, asked *events.Budget) *actionbus.Error {
	var b events.Budget
	if asked != nil {
		b = *asked
	}
	if b.MaxTokens < 0 || b.MaxCostUSD < 0 {
		return actionbus.Errorf(actionbus.CodeBudgetExceeded, "a run's budget must not be negative").
			WithDetail("budget", "request").WithDetail("requested", b)
	}
	b, raised := b.Within(m.lim.RunBudget)
	if raised {
		return actionbus.Errorf(actionbus.CodeBudgetExceeded, "the run asks for more budget than the host grants a run").
			WithDetail("budget", "request").WithDetail("requested", *asked).WithDetail("limit", m.lim.RunBudget)
	}
	daily, ok := m.lim.TenantBudgets[st.TenantOrDefault()]
	if !ok {
		daily = m.lim.TenantBudgets["*"]
	}
	if !daily.IsZero() {
		st.TenantBudget = &daily
		// No run may spend more than its tenant's day holds.
		b, _ = b.Within(daily)
	}
	if !b.IsZero() {
		st.Budget = &b
	}
	return nil
}

// spend counts the LLM calls a planner reports and returns the
// budget_exceeded error that ends the run when they went over its budget.
func (m *Machine) spend(st *State, calls []events.LLMUsage) *actionbus.Error {
	if len(calls) == 0 {
		return nil
	}
	if st.Usage == nil {
		st.Usage = &events.RunUsage{}
	}
	for _, c := range calls {
		st.Usage.Add(c)
	}
	if st.Budget == nil {
		return nil
	}
	which := st.Budget.Exceeded(*st.Usage)
	if which == "" {
		return nil
	}
	return actionbus.Errorf(actionbus.CodeBudgetExceeded, "the run's LLM calls went over its %s budget", which).
		WithDetail("budget", which).WithDetail("limit", *st.Budget).WithDetail("usage", *st.Usage)
}

// usedIfBounded is the run's usage as a planner request carries it: only
// when the run has a budget to check it against.
func (st *State) usedIfBounded() *events.RunUsage {
	if st.Budget == nil && st.TenantBudget == nil {
		return nil
	}
	if st.Usage == nil {
		return &events.RunUsage{}
	}
	return st.Usage
}

// ParseBudget reads a budget from JSON ({"maxTokens":N,"maxCostUsd":X});
// "" is no budget.
func ParseBudget(s string) (events.Budget, error) {
	var b events.Budget
	if strings.TrimSpace(s) == "" {
		return b, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return b, fmt.Errorf("budget: %w", err)
	}
	if b.MaxTokens < 0 || b.MaxCostUSD < 0 {
		return b, fmt.Errorf("budget: must not be negative")
	}
	return b, nil
}

// ParseTenantBudgets reads daily tenant budgets from JSON: a tenant (or
// "*", every other tenant) to its budget; "" is none.
func ParseTenantBudgets(s string) (map[string]events.Budget, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("tenant budgets: %w", err)
	}
	out := make(map[string]events.Budget, len(raw))
	for tenant, b := range raw {
		if tenant != "*" {
			if err := events.CheckTenant(tenant); err != nil {
				return nil, fmt.Errorf("tenant budgets: %w", err)
			}
		}
		budget, err := ParseBudget(string(b))
		if err != nil {
			return nil, fmt.Errorf("tenant budgets: %s: %w", tenant, err)
		}
		out[tenant] = budget
	}
	return out, nil
}
