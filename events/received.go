package events

import "github.com/cloudevents/sdk-go/v2/event"

// Received is a decoded and validated event.
type Received struct {
	// Event is the CloudEvent.
	Event *event.Event
	// Data is a pointer to the typed data struct of the event's type, e.g.
	// *RunRequested.
	Data any
	// Subject is the subject the message was published on.
	Subject string
	// Tenant is the run's tenant: the subject's tenant token on per-run
	// subjects (checked against the tenant extension), the extension on
	// work subjects, and "" for events of no run.
	Tenant string
}

// RunID returns the runid extension of the event ("" when absent).
func (r *Received) RunID() string {
	return StringExtension(r.Event, ExtRunID)
}
