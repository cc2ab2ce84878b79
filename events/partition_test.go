package events_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/events"
)

func TestCanonicalDropsOnlyTheStoredPartitionToken(t *testing.T) {
	s := events.MustSubjects("ab")
	for _, tc := range []struct{ in, want string }{
		{"ab.run.acme.01J.result.7", "ab.run.acme.01J.result"},
		{"ab.run.acme.01J.requested.0", "ab.run.acme.01J.requested"},
		{"ab.run.acme.01J.timer.1023", "ab.run.acme.01J.timer"},
		{"ab.run.acme.01J.result", "ab.run.acme.01J.result"},       // as published
		{"ab.run.acme.01J.sched.12", "ab.run.acme.01J.sched.12"},   // a schedule, never partitioned
		{"ab.run.acme.01J.result.x7", "ab.run.acme.01J.result.x7"}, // not a partition
		{"ab.run.acme.01J.result.", "ab.run.acme.01J.result."},
		{"ab.run.acme.01J.result.7.8", "ab.run.acme.01J.result.7.8"},
		{"ab.run.acme.01J.result.12345", "ab.run.acme.01J.result.12345"}, // more partitions than allowed
		{"ab.pool.default.request", "ab.pool.default.request"},
		{"other.run.acme.01J.result.7", "other.run.acme.01J.result.7"},
		{"", ""},
	} {
		assert.Equal(t, tc.want, s.Canonical(tc.in), tc.in)
	}
}

func TestStoredFiltersMatchWhatTheStreamsStore(t *testing.T) {
	s := events.MustSubjects("ab")
	assert.Equal(t, "ab.run.acme.01J.result.*", s.StoredRun("acme", "01J", "result"))
	assert.Equal(t, "ab.run.*.*.decision.*", s.StoredAnyRun("decision"))
	assert.Equal(t, "ab.run.*.*.decision.3", s.InPartition("decision", 3))
	assert.Equal(t, s.Run("acme", "01J", "result"), s.Canonical(s.Run("acme", "01J", "result")+".3"))
}

func FuzzCanonical(f *testing.F) {
	s := events.MustSubjects("ab")
	f.Add("ab.run.acme.01J.result.7")
	f.Add("ab.run.acme.01J.sched.7")
	f.Add("ab.run...")
	f.Fuzz(func(t *testing.T, subject string) {
		c := s.Canonical(subject)
		if c != subject && c+"."+subject[len(c)+1:] != subject {
			t.Fatalf("Canonical(%q) = %q is no prefix of it", subject, c)
		}
		if s.Canonical(c) != c && len(c) >= len(subject) {
			t.Fatalf("Canonical(%q) grew", subject)
		}
	})
}
