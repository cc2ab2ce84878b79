// Package events holds the wire model of actionbus: the data of every event
// a run publishes or consumes (RunRequested, Decision, Observation,
// AuditRecorded, ApprovalContext, …), the catalog of event types
// ([Catalog], [Lookup], the Type* names) and the subjects they travel on
// ([Subjects]), event ids ([NewID], [DerivedID], [ResultID]), run ids
// ([ValidRunID], [CheckRunID]), tenants ([ValidTenant], [CheckTenant],
// [TenantOr]), the limits every run is held to ([RunLimits]) and
// validation against the embedded JSON Schemas ([Validate]). Events are
// CloudEvents (github.com/cloudevents/sdk-go/v2); their data is JSON
// unless the event says msgpack ([SetData], [DataAs]).
//
// The package links no NATS client: it is the model a user's program, the
// run core and the services share. Publishing, consuming and the JetStream
// topology belong to the services. The catalog is documented in
// docs/events.md and the schemas in schemas/; both are kept in step with
// [Catalog] by tests.
//
// Every function is safe for concurrent use.
package events
