package dispatch

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/internal/policy"
)

// PolicyKey is the key of the policy document in the policy bucket.
const PolicyKey = "config"

// watchPolicy follows the policy bucket: a valid document under PolicyKey
// replaces the running policy configuration at once; an invalid one is
// logged and ignored (the previous policy stays in force).
func (d *Dispatcher) watchPolicy(ctx context.Context) error {
	kv, err := d.js.KeyValue(ctx, d.topo.BucketPolicy())
	if err != nil {
		return fmt.Errorf("dispatch: policy bucket: %w", err)
	}
	w, err := kv.Watch(ctx, PolicyKey)
	if err != nil {
		return fmt.Errorf("dispatch: watch policy: %w", err)
	}
	go func() {
		defer w.Stop() //nolint:errcheck // best effort
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					d.policy.Store(&policy.Evaluator{Config: d.cfg.Policy})
					d.log.Info("policy reset to the configured one")
					continue
				}
				cfg, err := policy.ParseConfig(e.Value())
				if err != nil {
					d.log.Error("policy document refused; the previous policy stays in force", "revision", e.Revision(), "err", err)
					continue
				}
				d.policy.Store(&policy.Evaluator{Config: cfg})
				d.log.Info("policy reloaded", "revision", e.Revision())
			}
		}
	}()
	return nil
}
