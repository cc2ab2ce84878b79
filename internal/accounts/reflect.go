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
	type stored struct {
		name     string
		subjects []string
	}
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
