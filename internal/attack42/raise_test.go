package attack42_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/llmtest"
)

// TestAttack42_CallerRaisesItsBudgetAboveTheHosts: the host grants a run
// 1 000 tokens; a caller asks for a billion on an agent run. Safe: the
// request is refused budget_exceeded before any LLM call.
func TestAttack42_CallerRaisesItsBudgetAboveTheHosts(t *testing.T) {
	llm := llmtest.New(t)
	llm.Respond(func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{Content: "Done.", Usage: &llmtest.Usage{PromptTokens: 900}}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL}, Register: registerReadURL,
		Limits: events.RunLimits{RunBudget: events.Budget{MaxTokens: 1000}}})
	res, err := st.Client.Run(ctxFor(t, 30*time.Second), client.RunRequest{Prompt: "Say done.", Budget: &client.Budget{MaxTokens: 1_000_000_000, MaxCostUSD: 1e308}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Empty(t, llm.Requests(), "no LLM call for a refused request")
}
