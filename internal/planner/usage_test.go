package planner

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/events"
)

// TestACallsUsageIsWhatTheProviderSaysOnlyWhenItCanBeTrue: usage a call
// cannot have (below zero, which would refund the run's and the tenant's
// budget) or none at all is estimated from the bytes; a count past any
// model's context is capped, so that no sum overflows.
func TestACallsUsageIsWhatTheProviderSaysOnlyWhenItCanBeTrue(t *testing.T) {
	p := &OpenAI{cfg: OpenAIConfig{Prices: map[string]events.Price{"m": {InputPerMillion: 1, OutputPerMillion: 1}}}}
	const sent, received = 4000, 400 // estimated: 1 000 and 100 tokens
	cases := []struct {
		name      string
		u         usage
		in, out   int64
		estimated bool
	}{
		{"reported", usage{input: 700, output: 30}, 700, 30, false},
		{"none reported", usage{}, 1000, 100, true},
		{"negative input", usage{input: -1_000_000, output: 5}, 1000, 100, true},
		{"negative output", usage{input: 5, output: -1}, 1000, 100, true},
		{"only output", usage{output: 7}, 0, 7, false},
		{"past any context", usage{input: 1 << 62, output: 1 << 62}, maxCallTokens, maxCallTokens, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := p.callUsage("m", tc.u, sent, received)
			assert.Equal(t, tc.in, got.InputTokens)
			assert.Equal(t, tc.out, got.OutputTokens)
			assert.Equal(t, tc.estimated, got.Estimated)
			assert.GreaterOrEqual(t, got.CostUSD, 0.0)
		})
	}
}
