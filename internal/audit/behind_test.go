package audit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
)

func TestBehind(t *testing.T) {
	chain := func(hashes ...string) []events.AuditRecorded {
		out := make([]events.AuditRecorded, len(hashes))
		for i, h := range hashes {
			out[i].Hash = h
		}
		return out
	}
	cases := []struct {
		name, want   string
		sink, stream []events.AuditRecorded
	}{
		{"the same chain", "", chain("a", "b", "c"), chain("a", "b", "c")},
		{"a tail cut from the sink", "truncated", chain("a", "b"), chain("a", "b", "c", "d")},
		{"the stream's oldest aged out", "", chain("a", "b", "c"), chain("b", "c")},
		{"a sink that went its own way", "diverges", chain("a", "b", "x"), chain("a", "b", "c")},
		{"nothing in common", "", chain("x", "y"), chain("a", "b")},
		{"an empty stream", "", chain("a"), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := audit.Behind(c.sink, c.stream)
			if c.want == "" {
				assert.Empty(t, got)
				return
			}
			assert.Contains(t, got, c.want)
		})
	}
}
