package process

import (
	"context"
	"encoding/base64"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestLeastPrivilegeUsersRunTheSystem starts a server with the accounts and
// users of deploy/nats, provisions as admin, runs every service as its own
// process with its own user, and completes runs as the client user. A
// permission missing from deploy/nats/accounts.conf fails a service or the
// run; a permission too many shows in the refusals checked at the end.
func TestLeastPrivilegeUsersRunTheSystem(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts four processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	url, _ := deployedServer(t, ctx)
	bin := buildServices(t)
	for _, svc := range []string{"dispatcher", "planner", "auditor", "executor"} {
		startService(t, filepath.Join(bin, svc), url(svc))
	}

	nc, clientRefused := connectAs(t, url("client"), "_INBOX_default")
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		list, _ := c.Actions(ctx)
		return len(list) >= 4
	}, 30*time.Second, 50*time.Millisecond, "executor did not publish the catalog")

	res, err := c.Run(ctx, client.RunRequest{Scenario: "delivery-triage", Prompt: "triage"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)

	// The bundled skills, as the deployed users: the executor publishes
	// them, the dispatcher reads them, the planner offers them.
	skillRun, err := c.Run(ctx, client.RunRequest{Scenario: "delivery-report", Prompt: "report"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, skillRun.Status, "%+v", skillRun.Error)
	assert.Contains(t, skillRun.Answer, "Reviewed by report-review.")

	// The audit trail was written by the auditor user: every record of
	// the run, in one chain.
	require.Eventually(t, func() bool {
		recs, err := c.AuditRecords(ctx, res.RunID)
		return err == nil && len(recs) > 10 && audit.Verify(recs) == -1 && audit.HasTerminal(recs)
	}, 10*time.Second, 50*time.Millisecond)

	// A mutation waits for an approval, which the approver user gives.
	approver, _ := connectAs(t, url("approver"), "_INBOX_default")
	ac, err := client.New(approver, client.Options{})
	require.NoError(t, err)
	runID, err := c.Start(ctx, client.RunRequest{Scenario: "delivery-retry", Prompt: "retry", AllowedModes: []string{"read", "dryRun", "mutate"}})
	require.NoError(t, err)
	var approvalID string
	_, err = c.Follow(ctx, runID, func(e client.Event) {
		if s, ok := e.Step(); ok && s.Name == "awaiting-approval" && approvalID == "" {
			approvalID = s.Details["approvalId"].(string)
			assert.NoError(t, ac.Approve(ctx, approvalID, "k1", deployApprovalKey))
		}
	})
	require.NoError(t, err)
	res, err = c.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Contains(t, res.Answer, "Retried after approval: job_1041, job_1043")

	// The client user cannot impersonate a service, decide, report
	// results, approve, or forge a step or live progress that followers
	// would show.
	forged := []string{"ab.run.default.X.completed", "ab.pool.default.request", "ab.run.default.X.decision", "ab.run.default.X.result",
		"ab.run.default.X.approve", "ab.run.default.X.deny", "ab.run.default.X.step", "ab.run.default.X.progress"}
	for _, subject := range forged {
		require.NoError(t, nc.Publish(subject, []byte("{}")))
	}
	require.NoError(t, nc.Flush())
	for _, subject := range forged {
		clientRefused.waitFor(t, `Permissions Violation for Publish to "`+subject+`"`)
	}

	// The executor user cannot start runs, forge progress or read the
	// audit stream.
	ex, exRefused := connectAs(t, url("executor"), "_INBOX_executor")
	require.NoError(t, ex.Publish("ab.run.default.X.requested", []byte("{}")))
	require.NoError(t, ex.Publish("ab.run.default.X.progress", []byte("{}")))
	exJS, err := jetstream.New(ex)
	require.NoError(t, err)
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	_, err = exJS.Stream(short, "AB_AUDIT")
	assert.Error(t, err, "the executor cannot look at the audit stream")
	_, err = exJS.OrderedConsumer(short, "AB_AUDIT", jetstream.OrderedConsumerConfig{})
	assert.Error(t, err, "nor read it")
	exRefused.waitFor(t, `Permissions Violation for Publish to "ab.run.default.X.requested"`)
	exRefused.waitFor(t, `Permissions Violation for Publish to "ab.run.default.X.progress"`)
	exRefused.waitFor(t, `Permissions Violation for Publish to "$JS.API.STREAM.INFO.AB_AUDIT"`)
}

// Receivers trust the dispatcher's events without checking them against
// their schema again (docs/events.md): that rests on no other user being
// able to publish on their subjects. Every subject of every event type
// the dispatcher produces, published as every other deployed user, is
// refused by the server, and so is a partition's fence.
func TestOnlyTheDispatcherPublishesItsEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, _ := deployedServer(t, ctx)
	var subjects []string
	for _, e := range events.Catalog {
		if !events.FromDispatcher(e.Type) {
			continue
		}
		subjects = append(subjects, strings.NewReplacer("{prefix}", "ab", "{tenant}", "default", "{runId}", events.NewID(), "{pool}", "default").Replace(e.Subject))
	}
	require.GreaterOrEqual(t, len(subjects), 10, "the dispatcher's event types")
	// The partitions' fences: a user who could publish one would stall
	// every end published before its state (each refused, then decided
	// again from the stored state), not change one.
	subjects = append(subjects, events.MustSubjects("ab").Fence(0), events.MustSubjects("ab").Fence(7))
	for _, user := range []struct{ name, inbox string }{
		{"client", "_INBOX_default"}, {"approver", "_INBOX_default"},
		{"executor", "_INBOX_executor"}, {"planner", "_INBOX_planner"}, {"auditor", "_INBOX_auditor"},
	} {
		t.Run(user.name, func(t *testing.T) {
			nc, refused := connectAs(t, url(user.name), user.inbox)
			for _, subject := range subjects {
				require.NoError(t, nc.Publish(subject, []byte("{}")))
			}
			require.NoError(t, nc.Flush())
			for _, subject := range subjects {
				refused.waitFor(t, `Permissions Violation for Publish to "`+subject+`"`)
			}
		})
	}
}

// deployApprovalKey is the approval key the dispatcher of a
// [deployedServer] test trusts (key id k1).
var deployApprovalKey = []byte("0123456789abcdef0123456789abcdef")

// deployedServer starts an embedded server with the accounts and users of
// deploy/nats (actionbustest's Options.Users: passwords pw-<user>, the
// server's default max payload), provisioned as admin, and sets the
// approval key in the environment of the service processes. It returns the URL of each user and the admin's JetStream
// context.
func deployedServer(t *testing.T, _ context.Context, tenants ...string) (url func(user string) string, adminJS jetstream.JetStream) {
	t.Helper()
	srv := deployed(t, tenants...)
	return srv.UserURL, srv.JS
}

// deployed starts a server with the repository's deploy/nats users (and
// tenants' users) and the approval keys the deployed services read.
func deployed(t *testing.T, tenants ...string) *actionbustest.Server {
	t.Helper()
	t.Setenv("ACTIONBUS_APPROVAL_KEYS", "k1:"+base64.StdEncoding.EncodeToString(deployApprovalKey))
	return actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: tenants})
}

// A stream that allows message schedules lets whoever publishes into it
// have the server write any subject of the stream (a schedule's target
// need only lie in it, and the server writes it without the publisher's
// permissions), or purge another schedule. When the runs stream allowed
// them, an executor or a planner could have the server write a forged
// run.completed one second later, or purge another run's alarm. Timers
// now live in a stream only the dispatcher publishes into: every such
// attempt by the executor and the planner is refused and nothing is
// written on the target; and the dispatcher's timers still fire, as the
// deployed dispatcher and auditor users (a decision that never comes
// times the run out, and the audit trail holds the fired timer).
func TestNoUserButTheDispatcherCanScheduleOrPurgeOnRunSubjects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server process and services")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, adminJS := deployedServer(t, ctx)
	bin := buildServices(t)
	// No planner: the decision's timer must fire.
	startService(t, filepath.Join(bin, "dispatcher"), url("dispatcher"), "--decision-timeout=1s")
	startService(t, filepath.Join(bin, "auditor"), url("auditor"))
	nc, _ := connectAs(t, url("client"), "_INBOX_default")
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	res, err := c.Run(ctx, client.RunRequest{Prompt: "nobody plans this"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.Equal(t, "stage_stalled", string(res.Error.Code), "%+v", res.Error)
	require.Eventually(t, func() bool {
		recs, err := c.AuditRecords(ctx, res.RunID)
		return err == nil && audit.HasTerminal(recs) && slices.ContainsFunc(recs, func(r client.AuditRecord) bool { return r.Kind == audit.KindTimer })
	}, 10*time.Second, 50*time.Millisecond, "the fired timer is audited")

	for _, user := range []struct{ name, inbox, verb string }{
		{"executor", "_INBOX_executor", "result"}, {"planner", "_INBOX_planner", "decision"},
	} {
		t.Run(user.name, func(t *testing.T) {
			nc, _ := connectAs(t, url(user.name), user.inbox)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			runID := events.NewID()
			target := "ab.run.default." + runID + ".completed"
			msg := forged(t, "ab.run.default."+runID+"."+user.verb, events.TypeRunCompleted, runID, events.NewID(),
				events.RunCompleted{RunID: runID, Answer: "forged"})
			msg.Header.Set("Nats-Schedule", "@at "+time.Now().UTC().Add(-time.Second).Format(time.RFC3339))
			msg.Header.Set("Nats-Schedule-Target", target)
			_, err = js.PublishMsg(ctx, msg)
			require.Error(t, err, "a schedule published as %s", user.name)

			purge := forged(t, "ab.run.default."+runID+"."+user.verb, events.TypeRunCompleted, runID, events.NewID(),
				events.RunCompleted{RunID: runID, Answer: "purge"})
			purge.Header.Set("Nats-Schedule-Next", "purge")
			purge.Header.Set("Nats-Scheduler", "ab.run.default."+runID+".sched.alarm")
			_, err = js.PublishMsg(ctx, purge)
			require.Error(t, err, "a schedule purge published as %s", user.name)

			runs, err := adminJS.Stream(ctx, "AB_RUNS")
			require.NoError(t, err)
			_, err = runs.GetLastMsgForSubject(ctx, target)
			require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "nothing was written on the target")
		})
	}
}

// An ended run's alarm is canceled by the dispatcher, which purges the
// run's schedule from the timers stream — as the deployed dispatcher user,
// whose permissions allow exactly that purge. No other user may purge
// timers: one that could would silence any run's deadlines.
func TestOnlyTheDispatcherPurgesTimersAndItCancelsAnEndedRunsAlarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server process and a service")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := deployed(t)
	url, adminJS := srv.UserURL, srv.JS
	bin := buildServices(t)
	// No planner: the run waits for its decision, its alarm minutes away.
	startService(t, filepath.Join(bin, "dispatcher"), url("dispatcher"))
	stored := func(subject string) int { return srv.Stored(t, "AB_TIMERS", subject) }

	// A victim's schedule, an hour away; each other user tries to purge it.
	victim := events.NewID()
	schedule := &nats.Msg{Subject: "ab.run.default." + victim + ".sched.alarm", Header: nats.Header{}, Data: []byte(`{}`)}
	schedule.Header.Set(bus.HeaderSchedule, "@at "+time.Now().UTC().Add(time.Hour).Truncate(time.Second).Format(time.RFC3339))
	schedule.Header.Set(bus.HeaderScheduleTarget, "ab.run.default."+victim+".timer")
	_, err := adminJS.PublishMsg(ctx, schedule)
	require.NoError(t, err)
	for _, user := range []struct{ name, inbox string }{
		{"client", "_INBOX_default"}, {"executor", "_INBOX_executor"}, {"planner", "_INBOX_planner"}, {"auditor", "_INBOX_auditor"},
	} {
		t.Run(user.name, func(t *testing.T) {
			nc, refused := connectAs(t, url(user.name), user.inbox)
			_, err := nc.Request("$JS.API.STREAM.PURGE.AB_TIMERS", []byte(`{"filter":"ab.run.default.`+victim+`.sched.*"}`), 2*time.Second)
			require.Error(t, err, "a purge of the timers stream as %s", user.name)
			refused.waitFor(t, "Permissions Violation for Publish")
			assert.Equal(t, 1, stored("ab.run.default."+victim+".sched.*"), "the victim's alarm is still armed")
		})
	}

	nc, _ := connectAs(t, url("client"), "_INBOX_default")
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	runID, err := c.Start(ctx, client.RunRequest{Prompt: "canceled while waiting for its decision"})
	require.NoError(t, err)
	alarm := "ab.run.default." + runID + ".sched.*"
	require.Eventually(t, func() bool { return stored(alarm) == 1 }, 10*time.Second, 10*time.Millisecond, "the alarm is armed")
	require.NoError(t, c.Cancel(ctx, runID, "test"))
	res, err := c.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCanceled, res.Status)
	// Due in minutes: gone now, it was purged, not fired.
	require.Eventually(t, func() bool { return stored(alarm) == 0 }, 10*time.Second, 10*time.Millisecond, "the ended run's alarm is canceled")
	assert.Zero(t, stored("ab.run.default."+runID+".timer"), "no timer fired")
}
