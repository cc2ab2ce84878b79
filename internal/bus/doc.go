// Package bus carries actionbus events over NATS JetStream: the [Bus]
// (publish with validation and deduplication, receive with validation and
// subject binding, [Bus.Serve] with its acknowledgement rules, and
// [Bus.Reject] so that nothing is silently dropped), the codec of the
// CloudEvents NATS protocol binding ([Encode], [Decode]; binary and
// structured content modes), and the [Topology]: the streams, consumers,
// key-value buckets and object stores a deployment provisions.
//
// The wire model itself — event data types, the catalog, subjects, ids and
// validation — is the public package github.com/actionbus/actionbus/events,
// which links no NATS; this package is the shell around it.
package bus
