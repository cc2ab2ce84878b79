package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// meter counts the LLM calls made for one request (a decision or a
// synthesis part) against the run's budget and its tenant's daily budget.
// The provider's calls find it in their context.
type meter struct {
	mu     sync.Mutex
	budget events.Budget
	// used is the run's usage: what the request said the run had used,
	// plus the calls made since.
	used  events.RunUsage
	calls []events.LLMUsage

	tenant string
	daily  events.Budget
	book   *spendBook
}

// newMeter meters a request of tenant's run: its budgets and what the
// run used before it.
func newMeter(tenant string, book *spendBook, budget, daily *events.Budget, used *events.RunUsage) *meter {
	m := &meter{tenant: tenant, book: book}
	if budget != nil {
		m.budget = *budget
	}
	if daily != nil {
		m.daily = *daily
	}
	if used != nil {
		m.used = *used
		m.used.ByModel = nil // only the totals count against the budget
	}
	return m
}

type meterKey struct{}

func withMeter(ctx context.Context, m *meter) context.Context {
	return context.WithValue(ctx, meterKey{}, m)
}

func meterFrom(ctx context.Context) *meter {
	m, _ := ctx.Value(meterKey{}).(*meter)
	return m
}

// admit is the check before a call to model whose input is estimated at
// tokens (and cost): a call the run's budget or its tenant's day cannot
// take is not made (budget_exceeded). It returns the tenant reservation
// that record settles.
func (m *meter) admit(ctx context.Context, model string, tokens int64, cost float64) (*hold, error) {
	if m == nil {
		return nil, nil
	}
	m.mu.Lock()
	ok := m.budget.Allows(m.used, tokens, cost)
	used := m.used
	m.mu.Unlock()
	if !ok {
		return nil, budgetError(m.budget, used, "tokens", "a call to %s (about %d input tokens) would go over the run's budget", model, tokens)
	}
	if m.daily.IsZero() {
		return nil, nil
	}
	if m.book == nil {
		return nil, errors.New("planner: a tenant budget without the planners' limits bucket")
	}
	bctx, cancel := bus.Bounded(ctx)
	defer cancel()
	return m.book.reserve(bctx, m.tenant, m.daily, tokens, cost)
}

// record counts one call made (u nil: the call used nothing it was told
// of) and settles its tenant reservation.
func (m *meter) record(ctx context.Context, h *hold, u *events.LLMUsage) error {
	if m == nil {
		return nil
	}
	if u != nil {
		m.mu.Lock()
		m.used.Add(*u)
		m.calls = append(m.calls, *u)
		m.mu.Unlock()
	}
	if h == nil {
		return nil
	}
	bctx, cancel := bus.Bounded(context.WithoutCancel(ctx))
	defer cancel()
	return m.book.settle(bctx, h, u)
}

// made returns the calls recorded.
func (m *meter) made() []events.LLMUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]events.LLMUsage(nil), m.calls...)
}

// budgetError is the budget_exceeded error: the budget, the bound named,
// and the usage so far. The dispatcher replaces the usage with the run's
// own when it ends the run.
func budgetError(b events.Budget, used events.RunUsage, which, format string, args ...any) *actionbus.Error {
	return actionbus.Errorf(actionbus.CodeBudgetExceeded, format, args...).
		WithDetail("budget", which).WithDetail("limit", b).WithDetail("usage", used)
}

// maxCallTokens bounds the tokens one call is counted for, input and
// output each: far above any model's context, low enough that no sum of
// a run's or a day's calls overflows.
const maxCallTokens = 1 << 40

// callUsage is what one call used: the provider's usage report, or an
// estimate from the bytes sent and received when it reported none; its
// cost at the model's price.
func (p *OpenAI) callUsage(model string, u usage, sentBytes, receivedBytes int) events.LLMUsage {
	out := events.LLMUsage{Model: model, InputTokens: min(u.input, maxCallTokens), OutputTokens: min(u.output, maxCallTokens)}
	if u.input <= 0 && u.output <= 0 || u.input < 0 || u.output < 0 {
		// No usage, or usage no call can have (a count below zero would
		// refund the run's and the tenant's budget): estimated.
		out.InputTokens, out.OutputTokens, out.Estimated = events.EstimateTokens(sentBytes), events.EstimateTokens(receivedBytes), true
	}
	if price, ok := p.cfg.Prices[model]; ok {
		out.CostUSD = price.Cost(out.InputTokens, out.OutputTokens)
	} else {
		out.Unpriced = true
	}
	return out
}

// inputEstimate estimates the input tokens of a call and their cost:
// what the budget is checked against before it is made.
func (p *OpenAI) inputEstimate(model string, sentBytes int) (int64, float64) {
	tokens := events.EstimateTokens(sentBytes)
	price := p.cfg.Prices[model]
	return tokens, price.Cost(tokens, 0)
}

// ParsePrices reads a price table: JSON mapping a model name to its
// prices per million tokens, e.g.
// {"gpt-4o-mini":{"inputPerMillion":0.15,"outputPerMillion":0.6}}.
func ParsePrices(s string) (map[string]events.Price, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out map[string]events.Price
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("planner: price table: %w", err)
	}
	for model, p := range out {
		if p.InputPerMillion < 0 || p.OutputPerMillion < 0 {
			return nil, fmt.Errorf("planner: price table: %s has a negative price", model)
		}
	}
	return out, nil
}
