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
	out := append([]events.AuditRecorded(nil), recs...)
	if err := (&Service{key: kp, pub: pub}).seal(&head{hash: prevHash, n: prevN}, out); err != nil {
		panic(err)
	}
	return out
}

// MarkDuplicates exposes markDuplicates.
var MarkDuplicates = markDuplicates

// B64 is how signatures are encoded.
var B64 = func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
