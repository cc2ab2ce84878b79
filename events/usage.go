package events

import (
	"math"
	"sort"
)

// LLMUsage is what one LLM call of a planner used: its tokens, from the
// provider's own usage report, and its cost from the planner's price
// table.
type LLMUsage struct {
	// Model is the model the call asked for (the provider's answer may
	// name a dated variant; the price table is keyed by what was asked).
	Model        string `json:"model"`
	InputTokens  int64  `json:"inputTokens"`
	OutputTokens int64  `json:"outputTokens"`
	// Estimated is true when the provider reported no usage: the tokens
	// are estimated from the text sent and received (EstimateTokens).
	Estimated bool `json:"estimated,omitempty"`
	// CostUSD is the call's cost from the price table; 0 when its model
	// has none (Unpriced).
	CostUSD  float64 `json:"costUsd"`
	Unpriced bool    `json:"unpriced,omitempty"`
}

// ModelUsage sums the calls of one model.
type ModelUsage struct {
	Calls        int     `json:"calls"`
	InputTokens  int64   `json:"inputTokens"`
	OutputTokens int64   `json:"outputTokens"`
	CostUSD      float64 `json:"costUsd"`
}

// RunUsage sums a run's LLM calls: what its terminal event, the run's
// listing and the console show.
type RunUsage struct {
	Calls        int     `json:"calls"`
	InputTokens  int64   `json:"inputTokens"`
	OutputTokens int64   `json:"outputTokens"`
	CostUSD      float64 `json:"costUsd"`
	// EstimatedCalls are the calls whose tokens are estimated.
	EstimatedCalls int `json:"estimatedCalls,omitempty"`
	// UnpricedCalls are the calls whose model has no price: the cost
	// leaves them out.
	UnpricedCalls int                   `json:"unpricedCalls,omitempty"`
	ByModel       map[string]ModelUsage `json:"byModel,omitempty"`
}

// Add counts one call.
func (u *RunUsage) Add(c LLMUsage) {
	u.Calls++
	u.InputTokens += c.InputTokens
	u.OutputTokens += c.OutputTokens
	u.CostUSD = roundCost(u.CostUSD + c.CostUSD)
	if c.Estimated {
		u.EstimatedCalls++
	}
	if c.Unpriced {
		u.UnpricedCalls++
	}
	if u.ByModel == nil {
		u.ByModel = map[string]ModelUsage{}
	}
	m := u.ByModel[c.Model]
	m.Calls++
	m.InputTokens += c.InputTokens
	m.OutputTokens += c.OutputTokens
	m.CostUSD = roundCost(m.CostUSD + c.CostUSD)
	u.ByModel[c.Model] = m
}

// Tokens is the input and output tokens together.
func (u RunUsage) Tokens() int64 { return u.InputTokens + u.OutputTokens }

// Models are the models used, sorted.
func (u RunUsage) Models() []string {
	out := make([]string, 0, len(u.ByModel))
	for m := range u.ByModel {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Budget bounds what a run may spend on LLM calls; a zero field is no
// bound.
type Budget struct {
	// MaxTokens bounds input and output tokens together.
	MaxTokens int64 `json:"maxTokens,omitempty"`
	// MaxCostUSD bounds the cost from the price table.
	MaxCostUSD float64 `json:"maxCostUsd,omitempty"`
}

// IsZero reports a budget that bounds nothing.
func (b Budget) IsZero() bool { return b.MaxTokens == 0 && b.MaxCostUSD == 0 }

// Exceeded names the bound u has gone over ("tokens" or "cost"), "" when
// it is within b.
func (b Budget) Exceeded(u RunUsage) string {
	switch {
	case b.MaxTokens > 0 && u.Tokens() > b.MaxTokens:
		return "tokens"
	case b.MaxCostUSD > 0 && u.CostUSD > b.MaxCostUSD:
		return "cost"
	}
	return ""
}

// Within returns b capped by limit, field by field (a zero field of
// either is no bound), and whether b asked for more than limit allows.
func (b Budget) Within(limit Budget) (Budget, bool) {
	out, raised := b, false
	if limit.MaxTokens > 0 {
		if out.MaxTokens == 0 || out.MaxTokens > limit.MaxTokens {
			raised = raised || out.MaxTokens > limit.MaxTokens
			out.MaxTokens = limit.MaxTokens
		}
	}
	if limit.MaxCostUSD > 0 {
		if out.MaxCostUSD == 0 || out.MaxCostUSD > limit.MaxCostUSD {
			raised = raised || out.MaxCostUSD > limit.MaxCostUSD
			out.MaxCostUSD = limit.MaxCostUSD
		}
	}
	return out, raised
}

// Allows reports whether a call of about tokens input tokens (and its
// cost at p, when the model is priced) still fits after u: the check a
// planner makes before it calls (an estimate, since the output is not
// known yet).
func (b Budget) Allows(u RunUsage, tokens int64, cost float64) bool {
	if b.MaxTokens > 0 && u.Tokens()+tokens > b.MaxTokens {
		return false
	}
	return b.MaxCostUSD == 0 || u.CostUSD+cost <= b.MaxCostUSD
}

// EstimateTokens estimates the tokens of text a provider did not count:
// about four bytes a token, rounded up (the rule of thumb OpenAI gives for
// English text).
func EstimateTokens(bytes int) int64 { return int64((bytes + 3) / 4) }

// roundCost keeps costs to a millionth of a dollar, so that sums of many
// calls do not drift in their last digits.
func roundCost(c float64) float64 { return math.Round(c*1e6) / 1e6 }

// Price is a model's price per million tokens, in USD.
type Price struct {
	InputPerMillion  float64 `json:"inputPerMillion"`
	OutputPerMillion float64 `json:"outputPerMillion"`
}

// Cost is the cost of a call's tokens at p.
func (p Price) Cost(input, output int64) float64 {
	return roundCost((float64(input)*p.InputPerMillion + float64(output)*p.OutputPerMillion) / 1e6)
}
