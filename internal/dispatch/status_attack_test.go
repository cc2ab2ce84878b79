package dispatch_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
)

// A pull request or a direct get that finds nothing is answered by the
// server with a status message (404 No Messages, 408 Request Timeout)
// whose body is empty, on the reply subject the asker named; and the
// JetStream API takes an empty body as a whole request: "delete this
// stream", "purge all of it". Found on 2026-12-07 by an attacker review:
// one publish by a deployed user deleted every tenant's run events. The
// server makes the message, so no rule on what a user stores can stop it:
// only a reply subject the user cannot aim at the services' account does.
// The planner and the auditor have that since they live in accounts of
// their own, which import what they send (a reply crossing an import is
// one the server made up in ACTIONBUS), as the executors do.
func TestNoServiceUserDeletesAStreamThroughAStatusReply(t *testing.T) {
	for _, c := range []struct {
		name, user, subject, body, reply, victim string
	}{
		{"the planner's direct get of a missing key", "planner", "$JS.API.DIRECT.GET.KV_ab_catalog.$KV.ab_catalog.nosuchkey",
			"", "$JS.API.STREAM.DELETE.AB_RUNS", "AB_RUNS"},
		{"the auditor's pull that finds nothing", "auditor", "$JS.API.CONSUMER.MSG.NEXT.AB_REJECTED.auditor-rejected",
			`{"batch":1,"no_wait":true}`, "$JS.API.STREAM.DELETE.AB_AUDIT", "AB_AUDIT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
			nc, err := nats.Connect(srv.UserURL(c.user), nats.CustomInboxPrefix("_INBOX_"+c.user))
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			// The control: the same request, answered on the user's inbox.
			inbox := nats.NewInbox()
			inbox = "_INBOX_" + c.user + inbox[len("_INBOX"):]
			sub, err := nc.SubscribeSync(inbox)
			require.NoError(t, err)
			require.NoError(t, nc.PublishRequest(c.subject, inbox, []byte(c.body)))
			status, err := sub.NextMsg(5 * time.Second)
			require.NoError(t, err, "the %s user's request is answered", c.user)
			require.Empty(t, status.Data, "a status message: %v", status.Header)

			require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: c.subject, Reply: c.reply, Data: []byte(c.body)}))
			require.NoError(t, nc.Flush())
			ctx := ctxT(t)
			assert.Never(t, func() bool {
				_, err := srv.JS.Stream(ctx, c.victim)
				return err != nil
			}, 1500*time.Millisecond, 50*time.Millisecond, "the %s user deleted %s", c.user, c.victim)
		})
	}
}
