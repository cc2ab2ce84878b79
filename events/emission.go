package events

// Extension is a CloudEvent extension attribute an event carries besides the
// standard ones (see the Ext* names), set when the bus builds the event.
type Extension struct {
	Name  string
	Value any
}

// Emission is one event to publish, as the run core renders it: the bus
// (internal/bus, Bus.EmitAll) builds the CloudEvent, validates it and
// publishes it. Subject and Header are empty but for timer schedules.
type Emission struct {
	Type, ID, Tenant, RunID, Pool string
	Data                          any
	Ext                           []Extension
	// Subject overrides the catalog subject (timer schedules).
	Subject string
	// Header adds message headers (timer schedules; a nats.Header is one).
	Header map[string][]string
}
