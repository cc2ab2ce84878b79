package bus

import "strings"

// AnswerableReply reports whether a service may answer a request on reply:
// only a reply inbox (every inbox prefix starts with "_INBOX": "_INBOX.",
// "_INBOX_<service>.", "_INBOX_<tenant>.") or the server's response
// subject of a request that crossed a service import ("_R_."). A
// requester chooses its reply subject, and a service's answer is
// published with the service's own permissions: a request whose reply
// names a stream, a bucket or a run subject would have the service write
// there for it (a confused deputy), so it is not answered at all.
func AnswerableReply(reply string) bool {
	if reply == "" || strings.ContainsAny(reply, "*> \t\r\n") {
		return false
	}
	return strings.HasPrefix(reply, "_INBOX") || strings.HasPrefix(reply, "_R_.")
}
