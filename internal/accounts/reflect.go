package accounts

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/actionbus/actionbus/internal/bus"
)

// DirectGetsOfOwnWrites returns, one line each, every stream of topo that
// a user of users other than admin and the dispatcher may both write and
// direct-get; the layout must have none.
//
// A direct get answers with the stored message itself, which the server
// publishes inside the account on the reply subject the asker named, and
// no NATS permission checks a reply subject: a user that stores a body of
// its choosing and direct-gets it has the server publish that body
// anywhere in the account — onto "$JS.API.STREAM.PURGE.AB_RUNS", a
// consumer create delivering another tenant's events to its inbox, or a
// run's state (docs/security.md, "Direct gets reflected"). Such a user
// reads what it writes with the message get, whose answer is a JSON
// document the API refuses as a request. admin may do anything anyway;
// the dispatcher writes the run states and direct-gets only into its own
// inbox.
func DirectGetsOfOwnWrites(topo bus.Topology, users []User) []string {
	streams := storedStreams(topo)
	var out []string
	for _, u := range users {
		if u.Name == "admin" || u.Name == "dispatcher" {
			continue
		}
		pub := make([]string, len(u.Permissions.Pub))
		for i, p := range u.Permissions.Pub {
			pub[i] = hubForm(p)
		}
		for _, st := range streams {
			get, write := "", ""
			for _, p := range pub {
				if get == "" && (server.SubjectsCollide(p, "$JS.API.DIRECT.GET."+st.name) ||
					server.SubjectsCollide(p, "$JS.API.DIRECT.GET."+st.name+".>")) {
					get = p
				}
				for _, s := range st.subjects {
					if write == "" && server.SubjectsCollide(p, s) {
						write = p
					}
				}
			}
			if get != "" && write != "" {
				out = append(out, fmt.Sprintf("%s writes %s (%s) and direct-gets it (%s)", u.Name, st.name, write, get))
			}
		}
	}
	return out
}

// stored is a stream of the topology and the subjects it stores.
type stored struct {
	name     string
	subjects []string
}

// storedStreams returns every stream of topo, buckets and object stores
// included, with the subjects it stores.
func storedStreams(topo bus.Topology) []stored {
	var streams []stored
	for _, sc := range topo.Streams() {
		streams = append(streams, stored{sc.Name, sc.Subjects})
	}
	for _, kc := range topo.Buckets() {
		streams = append(streams, stored{"KV_" + kc.Bucket, []string{"$KV." + kc.Bucket + ".>"}})
	}
	for _, oc := range topo.ObjectStores() {
		streams = append(streams, stored{"OBJ_" + oc.Bucket, []string{"$O." + oc.Bucket + ".>"}})
	}
	return streams
}

// StoredSubjectsHeard returns, one line each, every subscription a user
// of users in the services' account ([AccountOf]) other than admin may
// make on a subject a stream of topo stores; the layout must have none.
//
// A push consumer delivers on the subject named in its create request's
// body, in the stream's account, and does so while that account has
// interest in the subject. The planner and the auditor create push
// consumers of the catalog (their watches) and can name any subject of
// ACTIONBUS: were a subscriber of ACTIONBUS listening on a stored subject
// — a run's events, a run state's key — the server would deliver the
// catalog's entries and empty idle heartbeats there, and the stream would
// store them (checked: a run state overwritten with an empty value).
// Tenants' subscriptions live in their own accounts and give ACTIONBUS no
// such interest. admin, the operator's own tool, may listen anywhere.
func StoredSubjectsHeard(topo bus.Topology, users []User) []string {
	streams := storedStreams(topo)
	var out []string
	for _, u := range users {
		if u.Name == "admin" || AccountOf(u.Name) != ServiceAccount {
			continue
		}
		for _, sub := range u.Permissions.Sub {
			for _, st := range streams {
				for _, s := range st.subjects {
					if server.SubjectsCollide(hubForm(sub), s) {
						out = append(out, fmt.Sprintf("%s may subscribe to %s, which %s stores (%s)", u.Name, sub, st.name, s))
					}
				}
			}
		}
	}
	return out
}

// consumerCreates are the JetStream API's requests that create a consumer.
var consumerCreates = []string{"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"}

// ConsumerCreators returns, one line each, every permission by which a
// user of users in an account of its own (the planner, the auditor, the
// pools' executors: not [ServiceAccount]) may create a consumer; the
// layout must have none.
//
// A consumer lives in its stream's account, and a push consumer delivers
// to the subject its create request's body names, which no import
// rewrites: whoever may create one has the services' account publish the
// stream's messages, and empty idle heartbeats, on a subject of its
// choosing there, and a stream that stores that subject stores them (a
// run state overwritten with an empty value, checked on 2026-12-07). So
// such users read with direct gets, whose answers come back through their
// imports, and pull from consumers provisioning created.
func ConsumerCreators(users []User) []string {
	var out []string
	for _, u := range users {
		if AccountOf(u.Name) == ServiceAccount {
			continue
		}
		for _, p := range u.Permissions.Pub {
			for _, c := range consumerCreates {
				if server.SubjectsCollide(hubForm(p), c) {
					out = append(out, fmt.Sprintf("%s may publish %s, which creates a consumer", u.Name, p))
					break
				}
			}
		}
	}
	return out
}

// hubForm is a permission's subject in the hub's own form: the leaf-node
// forms "$JS.<domain>.API.X" and "$JS.<domain>.API.$KV.X" (see
// domainForms) as "$JS.API.X" and "$KV.X".
func hubForm(s string) string {
	rest, ok := strings.CutPrefix(s, "$JS."+JetStreamDomain+".API.")
	if !ok {
		return s
	}
	if strings.HasPrefix(rest, "$KV.") {
		return rest
	}
	return "$JS.API." + rest
}
