package audit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
)

func chain(n int) []events.AuditRecorded {
	var out []events.AuditRecorded
	prev := ""
	for i := 0; i < n; i++ {
		r := events.AuditRecorded{RunID: "R", EventID: string(rune('a' + i)), EventType: events.TypeRunStep,
			EventTime: time.Unix(int64(i), 0).UTC(), PayloadHash: "00", PrevHash: prev}
		r.Hash = audit.ChainHash(r)
		prev = r.Hash
		out = append(out, r)
	}
	return out
}

func TestVerifyDetectsTampering(t *testing.T) {
	assert.Equal(t, -1, audit.Verify(chain(5)))

	altered := chain(5)
	altered[2].Summary = "nothing happened here"
	assert.Equal(t, 2, audit.Verify(altered))

	removed := chain(5)
	removed = append(removed[:1], removed[2:]...)
	assert.Equal(t, 1, audit.Verify(removed))

	reordered := chain(3)
	reordered[1], reordered[2] = reordered[2], reordered[1]
	assert.Equal(t, 1, audit.Verify(reordered))
}
