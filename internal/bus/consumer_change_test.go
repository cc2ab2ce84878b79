package bus

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
)

func TestConsumerChange(t *testing.T) {
	want := jetstream.ConsumerConfig{Durable: "auditor-runs", AckPolicy: jetstream.AckAllPolicy, DeliverPolicy: jetstream.DeliverAllPolicy}
	info := func(ack jetstream.AckPolicy, floor, delivered uint64, mod func(*jetstream.ConsumerConfig)) *jetstream.ConsumerInfo {
		cfg := want
		cfg.AckPolicy = ack
		if mod != nil {
			mod(&cfg)
		}
		return &jetstream.ConsumerInfo{Config: cfg, AckFloor: jetstream.SequenceInfo{Stream: floor}, Delivered: jetstream.SequenceInfo{Stream: delivered}}
	}
	replaced := func(start uint64, before string) jetstream.ConsumerConfig {
		c := want
		c.DeliverPolicy, c.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
		if before != "" {
			c.Metadata = map[string]string{MetaDeliveredBefore: before}
		}
		return c
	}
	cases := []struct {
		name        string
		have        *jetstream.ConsumerInfo
		wantCfg     jetstream.ConsumerConfig
		wantReplace bool
	}{
		{"as declared: updated in place", info(jetstream.AckAllPolicy, 10, 12, nil), want, false},
		{"another ack policy, nothing delivered: created anew from the start", info(jetstream.AckExplicitPolicy, 0, 0, nil), want, true},
		{"another ack policy: replaced after its ack floor, naming what it had delivered",
			info(jetstream.AckExplicitPolicy, 10, 14, nil), replaced(11, "14"), true},
		{"another ack policy, everything acknowledged: replaced after its floor",
			info(jetstream.AckExplicitPolicy, 14, 14, nil), replaced(15, ""), true},
		{"a replacement keeps its start and metadata",
			info(jetstream.AckAllPolicy, 20, 30, func(c *jetstream.ConsumerConfig) {
				c.DeliverPolicy, c.OptStartSeq = jetstream.DeliverByStartSequencePolicy, 11
				c.Metadata = map[string]string{MetaDeliveredBefore: "14", "_nats.ver": "2.12"}
			}), replaced(11, "14"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, replace := consumerChange(tc.have, want)
			assert.Equal(t, tc.wantReplace, replace)
			assert.Equal(t, tc.wantCfg, cfg)
		})
	}
}
