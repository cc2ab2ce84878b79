package audit

import (
	"strconv"

	"github.com/actionbus/actionbus/events"
)

// StatusDuplicate is the status of an action record for a result that came
// after its call's outcome was recorded; the record's "duplicate" field
// names why (DuplicateRedispatch or DuplicateForgery).
const StatusDuplicate = "duplicate"

// Duplicate kinds.
const (
	// DuplicateRedispatch: the copy carries the result id the protocol
	// derives for the call and attempt ([events.ResultID]): an executor
	// answered the call again (a redispatched or redelivered request,
	// stored again past the stream's duplicate window).
	DuplicateRedispatch = "redispatch"
	// DuplicateForgery: the copy carries any other id, which no conforming
	// executor publishes.
	DuplicateForgery = "forgery"
)

// isOutcome reports whether r records an executor's result.
func isOutcome(r events.AuditRecorded) bool {
	_, ok := outcomeKey(r)
	return ok
}

// outcomeKey names the call and attempt a result record answers.
func outcomeKey(r events.AuditRecorded) (string, bool) {
	if r.Kind != KindAction || (r.EventType != events.TypeActionCompleted && r.EventType != events.TypeActionFailed) || r.ExecutionID == "" {
		return "", false
	}
	return r.ExecutionID + "/" + strconv.Itoa(r.Attempt), true
}

// markDuplicates returns recs with every result record after its call's
// first one (in known, the outcomes the chain holds, or earlier in recs)
// turned into a duplicate record: status "duplicate", the kind of
// duplicate, and the outcome's event id. The first result is the outcome,
// as it is for the dispatcher. known is not changed.
func markDuplicates(known map[string]string, recs []events.AuditRecorded) []events.AuditRecorded {
	out := make([]events.AuditRecorded, len(recs))
	var batch map[string]string
	for i, r := range recs {
		out[i] = r
		k, ok := outcomeKey(r)
		if !ok {
			continue
		}
		first, dup := known[k]
		if !dup {
			first, dup = batch[k]
		}
		if !dup {
			if batch == nil {
				batch = map[string]string{}
			}
			batch[k] = r.EventID
			continue
		}
		out[i].Status, out[i].DuplicateOf = StatusDuplicate, first
		out[i].Duplicate = DuplicateForgery
		if r.EventID == events.ResultID(r.ExecutionID, r.Attempt) {
			out[i].Duplicate = DuplicateRedispatch
		}
	}
	return out
}
