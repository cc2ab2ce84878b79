// Package events is the wire layer of actionbus: the CloudEvents model (from
// github.com/cloudevents/sdk-go/v2), this project's NATS codec for it (binary
// and structured content modes of the CloudEvents NATS protocol binding),
// the JSON and msgpack data codecs, event ids, subjects, the JetStream
// topology (streams, consumers, buckets) and schema validation on publish and
// on consume.
//
// It is not a message router and holds no run logic: services decide what to
// publish and what a consumed event means; this package makes sure that what
// crosses the bus is well-formed, validated, deduplicated and never silently
// dropped (see [Bus.Reject]).
//
// The catalog of event types lives in [Catalog] and is documented in
// docs/events.md; both are kept in step by a test.
package events
