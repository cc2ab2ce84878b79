package bus

import "testing"

func TestAnswerableReply(t *testing.T) {
	for _, tc := range []struct {
		reply string
		want  bool
	}{
		{"_INBOX.abc.1", true},
		{"_INBOX_executor.abc.1", true},
		{"_INBOX_acme.abc", true},
		{"_R_.xyz.ABC", true},
		{"", false},
		{"$KV.ab_catalog.default.x", false},
		{"$KV.ab_runs.01JB0000000000000000000000", false},
		{"$KV.ab_limits.k.abc", false},
		{"$JS.API.STREAM.PURGE.AB_TIMERS", false},
		{"ab.run.globex.01JB0000000000000000000000.completed", false},
		{"$O.ab_artifacts.M.x", false},
		{"_INBOX.>", false},
		{"_R_", false},
		{"x._INBOX.y", false},
	} {
		if got := AnswerableReply(tc.reply); got != tc.want {
			t.Errorf("AnswerableReply(%q) = %v, want %v", tc.reply, got, tc.want)
		}
	}
}
