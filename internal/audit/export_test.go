package audit

import (
	"encoding/base64"

	"github.com/actionbus/actionbus/events"
)

// SealForTest makes recs one format-2 append after a chain ending with
// prevHash and record number prevN, signed with seed, as the auditor does.
func SealForTest(seed []byte, prevHash string, prevN uint64, recs []events.AuditRecorded) []events.AuditRecorded {
	kp, err := keyPair(seed)
	if err != nil {
		panic(err)
	}
	pub, _ := kp.PublicKey()
	private, err := signingKey(kp)
	if err != nil {
		panic(err)
	}
	out := append([]events.AuditRecorded(nil), recs...)
	if err := (&Service{key: private, pub: pub}).seal(&head{hash: prevHash, n: prevN}, out); err != nil {
		panic(err)
	}
	return out
}

// MarkDuplicates exposes markDuplicates.
var MarkDuplicates = markDuplicates

// B64 is how signatures are encoded.
var B64 = func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// SignForTest signs rec as the auditor holding seed does.
func SignForTest(seed []byte, rec *events.AuditRecorded) {
	kp, err := keyPair(seed)
	if err != nil {
		panic(err)
	}
	private, err := signingKey(kp)
	if err != nil {
		panic(err)
	}
	sign(private, rec)
}

// FlushWait is flushWait, for its table test.
var FlushWait = flushWait
