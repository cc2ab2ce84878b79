package events_test

import (
	"crypto/sha256"
	"strconv"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/events"
)

// The result id, as docs/events.md specifies it for other languages.
func TestResultID(t *testing.T) {
	spec := func(callID string, attempt int) string {
		sum := sha256.Sum256([]byte(callID + "\x00result\x00" + strconv.Itoa(attempt)))
		var id ulid.ULID
		if parent, err := ulid.ParseStrict(callID); err == nil {
			_ = id.SetTime(parent.Time())
		}
		copy(id[6:], sum[:10])
		return id.String()
	}
	for _, c := range []struct {
		call    string
		attempt int
	}{
		{"01JD0000000000000000000000", 1},
		{"01JD0000000000000000000000", 2},
		{"01M8VCWM8D284PHATK775D9BCG", 1},
		{"not-a-ulid", 3},
	} {
		got := events.ResultID(c.call, c.attempt)
		assert.Equal(t, spec(c.call, c.attempt), got, "%s/%d", c.call, c.attempt)
		assert.Len(t, got, 26)
	}
	assert.NotEqual(t, events.ResultID("01JD0000000000000000000000", 1), events.ResultID("01JD0000000000000000000000", 2))
	// The example of docs/events.md, for implementations in other languages.
	assert.Equal(t, "01JD000000R0KQE2F5EV3JFSJ1", events.ResultID("01JD0000000000000000000000", 1))
}
