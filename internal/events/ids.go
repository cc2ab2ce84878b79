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
