package service

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The services collect garbage at DefaultGCPercent unless the
// environment's GOGC says otherwise (whatever it says).
func TestGCPercentIsTheDefaultUnlessGOGCIsSet(t *testing.T) {
	for _, tc := range []struct {
		gogc string
		want int
		set  bool
	}{
		{"", DefaultGCPercent, true},
		{"100", 0, false},
		{"off", 0, false},
		{"400", 0, false},
	} {
		got, set := gcPercent(tc.gogc)
		assert.Equal(t, tc.set, set, "GOGC=%q", tc.gogc)
		assert.Equal(t, tc.want, got, "GOGC=%q", tc.gogc)
	}
}
