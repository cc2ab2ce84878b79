package events

import (
	"crypto/rand"
	"crypto/sha256"
	"strconv"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// NewID returns a fresh ULID for a new fact (a new run, a rejected event
// republished). It is safe for concurrent use.
func NewID() string {
	return ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
}

// DerivedID returns the id of an event derived from a cause: the same cause
// and parts always give the same id, so a restarted service that republishes
// the event is deduplicated by JetStream (Nats-Msg-Id).
//
// The result is a valid ULID. When cause is itself a ULID its timestamp is
// kept, so derived ids sort near their cause; the entropy is the first 80
// bits of SHA-256 over the cause and parts.
func DerivedID(cause string, parts ...any) string {
	h := sha256.New()
	h.Write([]byte(cause))
	for _, p := range parts {
		h.Write([]byte{0})
		switch v := p.(type) {
		case string:
			h.Write([]byte(v))
		case int:
			h.Write([]byte(strconv.Itoa(v)))
		case int64:
			h.Write([]byte(strconv.FormatInt(v, 10)))
		case uint64:
			h.Write([]byte(strconv.FormatUint(v, 10)))
		default:
			panic("events: DerivedID part must be a string or an integer")
		}
	}
	sum := h.Sum(nil)
	var id ulid.ULID
	if parent, err := ulid.ParseStrict(strings.ToUpper(cause)); err == nil {
		_ = id.SetTime(parent.Time())
	}
	_ = id.SetEntropy(sum[:10])
	return id.String()
}

// ResultID is the event id of an executor's result (action.completed or
// action.failed) for the call callID at attempt: [DerivedID] of callID
// with the parts "result" and the attempt. Every answer to the same call
// and attempt (a redelivered or redispatched request, an idempotent
// replay) carries this id, so JetStream stores one of them within the
// duplicate window, and the auditor tells a copy beyond it from a forgery.
//
// In another language: the ULID whose 48-bit timestamp is callID's (when
// callID is a ULID, else 0) and whose 80 bits of entropy are the first 10
// bytes of SHA-256(callID || 0x00 || "result" || 0x00 || decimal attempt),
// in Crockford base32 (26 upper-case characters).
func ResultID(callID string, attempt int) string {
	return DerivedID(callID, "result", attempt)
}
