package audit

import (
	"fmt"
	"slices"
	"strings"

	"github.com/actionbus/actionbus/events"
)

// Finding kinds: why a chain does not verify.
const (
	// BreakLink: a record's hash, or its link to the record before it,
	// does not match.
	BreakLink = "link"
	// BreakGap: format-2 record numbers skip: records were removed.
	BreakGap = "gap"
	// BreakSignature: a signature does not verify against the auditor's
	// key: the records it covers were rewritten without the key.
	BreakSignature = "signature"
	// BreakUnsigned: format-2 records end without a signature after them.
	BreakUnsigned = "unsigned"
	// BreakDowngrade: a format-1 (unsigned) record follows format-2 ones.
	BreakDowngrade = "downgrade"
)

// Finding is where and why a chain does not verify.
type Finding struct {
	// Kind is one of the Break* kinds.
	Kind string
	// At is the index of the first record that does not verify; From
	// (<= At) the first record it puts in doubt (for a signature, the
	// record after the last good signature).
	From, At int
	// Message says what was found, naming records by their 1-based place.
	Message string
}

// Verification is the outcome of [Check].
type Verification struct {
	// Records is the number of records checked; Format1 how many of them
	// are format 1 (unsigned, written before chains were signed).
	Records, Format1 int
	// Signers are the keys whose signatures verified, in order of first
	// use.
	Signers []string
	// Pinned is true when the signatures were checked against keys the
	// verifier gave; false when only against the key each record names
	// (which proves consistency, not who wrote it).
	Pinned bool
	// Broken is nil when the chain verifies.
	Broken *Finding
}

// Format describes the chain's format for a person.
func (v Verification) Format() string {
	signed := "signed by " + strings.Join(v.Signers, ", ")
	if !v.Pinned && len(v.Signers) > 0 {
		signed += " (key not pinned: pass the auditor's public key to prove who signed)"
	}
	switch {
	case v.Format1 == v.Records:
		return "format 1, unsigned"
	case v.Format1 == 0:
		return "format 2, " + signed
	default:
		return fmt.Sprintf("format 1, unsigned (records 1-%d), then format 2, %s", v.Format1, signed)
	}
}

// Check verifies a run's chain, in chain order, against the auditor's
// public keys (keys; none means each signature is checked against the key
// its record names). Format-1 records (no "v") must all come first and
// are checked as before: each hash right and naming its predecessor.
// Format-2 records must also number on without a gap, and every one must
// be covered by a valid signature at or after it (the last record of each
// append is signed, and its hash chains every record before it).
func Check(records []events.AuditRecorded, keys ...string) Verification {
	v := Verification{Records: len(records), Pinned: len(keys) > 0}
	prev, lastN, lastSigned := "", uint64(0), -1
	brk := func(kind string, from, at int, format string, args ...any) Verification {
		v.Broken = &Finding{Kind: kind, From: from, At: at, Message: fmt.Sprintf(format, args...)}
		return v
	}
	for i, r := range records {
		if r.V == 0 {
			if i > 0 && records[i-1].V != 0 {
				return brk(BreakDowngrade, i, i, "record %d is format 1 (unsigned) after format-2 records: the chain was rewritten", i+1)
			}
			v.Format1++
		} else if r.N != lastN+1 {
			if r.N > lastN+1 {
				return brk(BreakGap, i, i, "records missing before record %d: it is number %d, the record before it %d", i+1, r.N, lastN)
			}
			return brk(BreakGap, i, i, "record %d is number %d, after number %d: records were reordered or copied", i+1, r.N, lastN)
		}
		if r.PrevHash != prev || ChainHash(r) != r.Hash {
			return brk(BreakLink, i, i, "record %d: its hash or its link to the previous record does not match", i+1)
		}
		if r.V != 0 && r.Sig != "" {
			if !signedBy(r, keys) {
				return brk(BreakSignature, lastSigned+1, i,
					"record %d's signature does not verify against the auditor's key: records %d-%d were written or rewritten without it", i+1, lastSigned+2, i+1)
			}
			if !slices.Contains(v.Signers, r.Signer) {
				v.Signers = append(v.Signers, r.Signer)
			}
			lastSigned = i
		}
		prev, lastN = r.Hash, r.N
	}
	if n := len(records); n > 0 && records[n-1].V != 0 && lastSigned != n-1 {
		return brk(BreakUnsigned, lastSigned+1, n-1, "records %d-%d are not covered by any signature: written without the auditor's key", lastSigned+2, n)
	}
	return v
}

// signedBy reports whether r's signature verifies under one of keys, or
// under the key r names when keys is empty.
func signedBy(r events.AuditRecorded, keys []string) bool {
	if len(keys) == 0 {
		return r.Signer != "" && signatureValid(r.Signer, r)
	}
	for _, k := range keys {
		if signatureValid(k, r) {
			return true
		}
	}
	return false
}

// Stored is where one of a run's events is stored.
type Stored struct {
	Stream string
	Seq    uint64
	Type   string
}

// SourceGap is a stored event of a run that no record names, although the
// chain covers its stream past it.
type SourceGap struct {
	Stored
	// Before is the index of the first record naming a later event of the
	// same stream.
	Before int
}

// SourceGaps checks the continuity of the events a chain covers: for each
// stream, every stored event of the run (stored, as far as the stream
// still holds them) from the first to the last one the chain's records
// name must be named by a record. Events before the first (a format-1
// prefix, events the stream dropped) or after the last (not audited yet,
// or a cut tail, which [HasTerminal] sees for an ended run) are not
// judged. It returns the gaps in stored order.
func SourceGaps(records []events.AuditRecorded, stored []Stored) []SourceGap {
	type span struct{ lo, hi uint64 }
	spans := map[string]span{}
	named := map[Stored]bool{}
	for _, r := range records {
		if r.Source == nil {
			continue
		}
		named[Stored{Stream: r.Source.Stream, Seq: r.Source.Seq}] = true
		sp, ok := spans[r.Source.Stream]
		if !ok {
			sp = span{r.Source.Seq, r.Source.Seq}
		}
		sp.lo, sp.hi = min(sp.lo, r.Source.Seq), max(sp.hi, r.Source.Seq)
		spans[r.Source.Stream] = sp
	}
	var gaps []SourceGap
	for _, e := range stored {
		sp, ok := spans[e.Stream]
		if !ok || e.Seq < sp.lo || e.Seq > sp.hi || named[Stored{Stream: e.Stream, Seq: e.Seq}] {
			continue
		}
		before := slices.IndexFunc(records, func(r events.AuditRecorded) bool {
			return r.Source != nil && r.Source.Stream == e.Stream && r.Source.Seq > e.Seq
		})
		gaps = append(gaps, SourceGap{Stored: e, Before: before})
	}
	return gaps
}
