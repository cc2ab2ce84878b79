package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// spendBook keeps what each tenant's LLM calls spent in one UTC day, in
// the planners' limits bucket, so that every planner process enforces the
// same tenant budget. A call reserves a call's worth before it is made
// (the larger of its estimated input and the day's largest call so far),
// under a revision check, and settles to what it used after: planners
// cannot together take more than the budget holds, and the day's spend
// goes over it by at most what a call used beyond the largest before it.
type spendBook struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// daySpend is a tenant's spend of one day (the bucket entry
// "budget.<tenant>.<YYYY-MM-DD>", JSON).
type daySpend struct {
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"costUsd"`
	Calls   int     `json:"calls"`
	// LargestTokens and LargestCostUSD are the day's largest call: what
	// the next call reserves at least.
	LargestTokens  int64   `json:"largestTokens"`
	LargestCostUSD float64 `json:"largestCostUsd"`
}

// hold is a reservation to settle once its call is made (or not).
type hold struct {
	key    string
	tokens int64
	cost   float64
}

func (b *spendBook) key(tenant string) string {
	return "budget." + events.TenantOr(tenant) + "." + b.now().UTC().Format("2006-01-02")
}

// reserve takes tokens (and cost) of tenant's day, or returns the
// budget_exceeded error when they would go over limit.
func (b *spendBook) reserve(ctx context.Context, tenant string, limit events.Budget, tokens int64, cost float64) (*hold, error) {
	h := &hold{key: b.key(tenant)}
	err := b.update(ctx, h.key, func(d *daySpend) error {
		h.tokens, h.cost = max(tokens, d.LargestTokens), max(cost, d.LargestCostUSD)
		spent := events.RunUsage{InputTokens: d.Tokens, CostUSD: d.CostUSD}
		if !limit.Allows(spent, h.tokens, h.cost) {
			return actionbus.Errorf(actionbus.CodeBudgetExceeded, "tenant %s has spent its LLM budget for today (UTC)", events.TenantOr(tenant)).
				WithDetail("budget", "tenant").WithDetail("limit", limit).WithDetail("spentToday", *d)
		}
		d.Tokens += h.tokens
		d.CostUSD += h.cost
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// settle replaces a reservation by what its call used (nothing for a call
// that failed unanswered).
func (b *spendBook) settle(ctx context.Context, h *hold, used *events.LLMUsage) error {
	return b.update(ctx, h.key, func(d *daySpend) error {
		d.Tokens -= h.tokens
		d.CostUSD -= h.cost
		if used != nil {
			d.Tokens += used.InputTokens + used.OutputTokens
			d.CostUSD += used.CostUSD
			d.Calls++
			d.LargestTokens = max(d.LargestTokens, used.InputTokens+used.OutputTokens)
			d.LargestCostUSD = max(d.LargestCostUSD, used.CostUSD)
		}
		d.Tokens, d.CostUSD = max(d.Tokens, 0), max(d.CostUSD, 0)
		return nil
	})
}

// update applies fn to a day's spend under a revision check, retrying on
// conflicts with other planners.
func (b *spendBook) update(ctx context.Context, key string, fn func(*daySpend) error) error {
	for attempt := 0; attempt < 64; attempt++ {
		var d daySpend
		var rev uint64
		e, err := b.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("planner: read the day's spend %s: %w", key, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &d); err != nil {
				return fmt.Errorf("planner: the day's spend %s is not JSON: %w", key, err)
			}
		}
		if err := fn(&d); err != nil {
			return err
		}
		val, err := json.Marshal(d)
		if err != nil {
			return err
		}
		err = bus.PutRevision(ctx, b.kv, key, val, rev)
		if err == nil {
			return nil
		}
		if !bus.IsRevisionConflict(err) {
			return fmt.Errorf("planner: write the day's spend %s: %w", key, err)
		}
	}
	return fmt.Errorf("planner: the day's spend %s: too many concurrent changes", key)
}
