package planner

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/limits"
)

// Modeler is implemented by providers that call a model: its name keys the
// planner's LLM limit.
type Modeler interface {
	// Model names the model the provider plans with.
	Model() string
}

// llmAction is the name LLM calls are limited under: "llm:<provider>" and
// the model, when the provider names one.
func llmAction(p Provider) string {
	name := "llm:" + p.Name()
	if m, ok := p.(Modeler); ok && m.Model() != "" {
		name += ":" + m.Model()
	}
	return name
}

// llmLease bounds how long a slot is held by a planner that vanished
// mid-call.
const llmLease = 5 * time.Minute

// acquireLLM waits for a slot of the planner's LLM limit (none configured:
// at once) and returns the function that frees it. While it waits it
// tells JetStream the request is in progress, so it is not redelivered;
// the wait ends with ctx (the run's own decision deadline fails the run
// if the wait outlasts it).
func (s *Service) acquireLLM(ctx context.Context, tenant, runID, requestID string, msg jetstream.Msg) (func(), error) {
	if s.llm == nil {
		return func() {}, nil
	}
	spec := *s.cfg.LLMLimit
	key, err := spec.RenderKey(limits.Call{Tenant: tenant, Action: s.llmAction})
	if err != nil {
		return nil, err
	}
	req := limits.Request{CallID: requestID, RunID: runID, Tenant: tenant, Lease: llmLease}
	waited := false
	for {
		bctx, cancel := bus.Bounded(ctx)
		g, err := s.llm.Acquire(bctx, key, spec, req)
		cancel()
		if err != nil {
			return nil, err
		}
		if g.OK {
			if waited {
				s.log.Debug("LLM capacity granted", "run", runID, "key", key)
			}
			return func() {
				rctx, cancel := bus.Bounded(context.WithoutCancel(ctx))
				defer cancel()
				if _, err := s.llm.Release(rctx, key, requestID, 0); err != nil {
					s.log.Warn("LLM slot not released; its lease frees it", "key", key, "err", err)
				}
			}, nil
		}
		waited = true
		if msg != nil {
			_ = msg.InProgress()
		}
		t := time.NewTimer(time.Until(g.RetryAt))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
