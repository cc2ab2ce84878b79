// Command planner runs the actionbus planner service, with the openai
// provider (any OpenAI-compatible endpoint) or the script provider
// (scenarios from files, plus the built-in demo scenarios).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/internal/demo"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	var c service.Common
	c.Flags(flag.CommandLine)
	provider := flag.String("provider", service.Env("ACTIONBUS_PROVIDER", "script"), "decision provider: script or openai (env ACTIONBUS_PROVIDER)")
	scenarios := flag.String("scenarios", service.Env("ACTIONBUS_SCENARIOS", ""), "script provider: comma-separated scenario files or directories (env ACTIONBUS_SCENARIOS)")
	concurrency := flag.Int("concurrency", service.EnvInt("ACTIONBUS_CONCURRENCY", planner.DefaultConcurrency), "decisions made at once (env ACTIONBUS_CONCURRENCY)")
	var oc planner.OpenAIConfig
	flag.StringVar(&oc.BaseURL, "openai-base-url", service.Env("ACTIONBUS_OPENAI_BASE_URL", "https://api.openai.com/v1"), "openai provider: OpenAI-compatible endpoint (env ACTIONBUS_OPENAI_BASE_URL); the API key is read from the environment only: ACTIONBUS_OPENAI_API_KEY, else OPENAI_API_KEY")
	flag.StringVar(&oc.Model, "openai-model", service.Env("ACTIONBUS_OPENAI_MODEL", ""), "openai provider: model name (env ACTIONBUS_OPENAI_MODEL)")
	pool := flag.String("openai-models", service.Env("ACTIONBUS_OPENAI_MODELS", ""), "openai provider: model pool key=model,... (env ACTIONBUS_OPENAI_MODELS)")
	flag.StringVar(&oc.PlanningModelKey, "planning-model-key", service.Env("ACTIONBUS_PLANNING_MODEL_KEY", ""), "openai provider: pool key of the planning model (env ACTIONBUS_PLANNING_MODEL_KEY)")
	flag.StringVar(&oc.SynthesisModelKey, "synthesis-model-key", service.Env("ACTIONBUS_SYNTHESIS_MODEL_KEY", ""), "openai provider: pool key of the synthesis model (env ACTIONBUS_SYNTHESIS_MODEL_KEY)")
	flag.StringVar(&oc.Mode, "planner-mode", service.Env("ACTIONBUS_PLANNER_MODE", planner.ModeNativeTools), "openai provider: native_tools or envelope (env ACTIONBUS_PLANNER_MODE)")
	flag.DurationVar(&oc.CallTimeout, "llm-timeout", service.EnvDuration("ACTIONBUS_LLM_TIMEOUT", 0), "openai provider: deadline of each LLM call; default 60s (env ACTIONBUS_LLM_TIMEOUT)")
	prices := flag.String("llm-prices", service.Env("ACTIONBUS_LLM_PRICES", ""), `openai provider: price table, model to USD per million tokens, as JSON, e.g. {"gpt-4o-mini":{"inputPerMillion":0.15,"outputPerMillion":0.6}} (env ACTIONBUS_LLM_PRICES; docs/limits.md)`)
	llmLimit := flag.String("llm-limit", service.Env("ACTIONBUS_LLM_LIMIT", ""), `limit of the provider's calls across every planner, as JSON, e.g. {"maxInFlight":4,"rate":{"limit":60,"perMs":60000}} (env ACTIONBUS_LLM_LIMIT; docs/limits.md)`)
	flag.Parse()
	// The key only from the environment: flags show up in process lists.
	oc.APIKey = planner.APIKeyFromEnv()
	os.Exit(service.Main("planner", c, func(nc *nats.Conn, log *slog.Logger, m *metrics.Metrics) (service.Runner, error) {
		var p planner.Provider
		switch *provider {
		case "openai":
			models, err := planner.ParseModelPool(*pool)
			if err != nil {
				return nil, err
			}
			oc.Models = models
			if oc.Prices, err = planner.ParsePrices(*prices); err != nil {
				return nil, err
			}
			if p, err = planner.NewOpenAI(oc); err != nil {
				return nil, err
			}
		case "script":
			var files []string
			if *scenarios != "" {
				files = strings.Split(*scenarios, ",")
			}
			script, _, err := demo.Script(files...)
			if err != nil {
				return nil, err
			}
			p = script
		default:
			return nil, fmt.Errorf("unknown provider %q (want script or openai)", *provider)
		}
		cfg := planner.Config{Prefix: c.Prefix, Provider: p, Concurrency: *concurrency, Logger: log, Metrics: m}
		if *llmLimit != "" {
			cfg.LLMLimit = new(limits.Spec)
			if err := json.Unmarshal([]byte(*llmLimit), cfg.LLMLimit); err != nil {
				return nil, fmt.Errorf("--llm-limit: %w", err)
			}
		}
		return planner.New(nc, cfg)
	}))
}
