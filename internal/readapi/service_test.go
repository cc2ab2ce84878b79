package readapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/readapi"
	"github.com/actionbus/actionbus/internal/skills"
	"github.com/actionbus/actionbus/internal/skills/skillstore"
)

type echoIn struct {
	Text string `json:"text"`
}

func registerEcho(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "test.echo", Description: "Echo the text."},
		func(_ context.Context, in echoIn, _ executor.Call) (executor.Result[echoIn], error) {
			return executor.Result[echoIn]{Output: in, Summary: "echoed"}, nil
		})
}

// fixture is a stack with one completed run of acme and one of globex.
type fixture struct {
	srv            *actionbustest.Server
	acme, globex   *readapi.Caller
	acmeRun, glRun string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{Register: registerEcho})
	f := &fixture{srv: srv}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		tenant string
		run    *string
		caller **readapi.Caller
	}{{"acme", &f.acmeRun, &f.acme}, {"globex", &f.glRun, &f.globex}} {
		nc := srv.Connect(t)
		c, err := client.New(nc, client.Options{Tenant: tc.tenant})
		require.NoError(t, err)
		res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.echo", Args: map[string]any{"text": tc.tenant}}}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status)
		*tc.run = res.RunID
		*tc.caller = readapi.NewCaller(nc, "", tc.tenant)
	}
	return f
}

func code(err error) actionbus.Code { return actionbus.CodeOf(err) }

func scanAll(t *testing.T, c *readapi.Caller, op string, req readapi.Request) ([]readapi.Msg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []readapi.Msg
	_, err := c.Scan(ctx, op, req, func(m readapi.Msg) bool { out = append(out, m); return true })
	return out, err
}

// consumers counts the consumers of every stream.
func consumers(t *testing.T, srv *actionbustest.Server) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	for name := range srv.JS.StreamNames(ctx).Name() {
		st, err := srv.JS.Stream(ctx, name)
		require.NoError(t, err)
		info, err := st.Info(ctx)
		require.NoError(t, err)
		n += info.State.Consumers
	}
	return n
}

func TestTheReadServiceAnswersEachOperationWithoutAConsumer(t *testing.T) {
	f := newFixture(t)
	before := consumers(t, f.srv)

	t.Run("events of a run, in stored order, ending with its terminal event", func(t *testing.T) {
		msgs, err := scanAll(t, f.acme, readapi.OpEvents, readapi.Request{Run: f.acmeRun})
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		for i, m := range msgs {
			assert.True(t, strings.HasPrefix(m.Subject, "ab.run.acme."+f.acmeRun+"."), m.Subject)
			if i > 0 {
				assert.Greater(t, m.Seq, msgs[i-1].Seq)
			}
		}
		assert.Equal(t, "ab.run.acme."+f.acmeRun+".completed", msgs[len(msgs)-1].Subject)
	})
	t.Run("the last event of each verb", func(t *testing.T) {
		var p readapi.Page
		require.NoError(t, f.acme.Call(context.Background(), readapi.OpEvents,
			readapi.Request{Run: f.acmeRun, Verbs: []string{"completed", "failed", "canceled"}, Last: true}, &p))
		require.Len(t, p.Msgs, 1)
		assert.Equal(t, events.TypeRunCompleted, nats.Header(p.Msgs[0].Header).Get("ce-type"))
	})
	t.Run("the request from the requests stream, headers only", func(t *testing.T) {
		msgs, err := scanAll(t, f.acme, readapi.OpEvents, readapi.Request{Run: f.acmeRun, Stream: readapi.StreamRequests, HeadersOnly: true})
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		assert.Equal(t, events.TypeRunRequested, nats.Header(msgs[0].Header).Get("ce-type"))
		assert.Empty(t, msgs[0].Data)
	})
	t.Run("the tenant's runs since a time", func(t *testing.T) {
		msgs, err := scanAll(t, f.acme, readapi.OpRuns, readapi.Request{})
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		for _, m := range msgs {
			assert.True(t, strings.HasPrefix(m.Subject, "ab.run.acme."), m.Subject)
		}
		future := time.Now().Add(time.Hour)
		msgs, err = scanAll(t, f.acme, readapi.OpRuns, readapi.Request{Since: &future})
		require.NoError(t, err)
		assert.Empty(t, msgs)
	})
	t.Run("audit records of a run and of the tenant", func(t *testing.T) {
		require.Eventually(t, func() bool {
			msgs, err := scanAll(t, f.acme, readapi.OpAudit, readapi.Request{Run: f.acmeRun})
			return err == nil && len(msgs) > 0
		}, 10*time.Second, 20*time.Millisecond)
		msgs, err := scanAll(t, f.acme, readapi.OpAudit, readapi.Request{})
		require.NoError(t, err)
		for _, m := range msgs {
			assert.True(t, strings.HasPrefix(m.Subject, "ab.audit.acme."), m.Subject)
		}
	})
	t.Run("catalog of actions", func(t *testing.T) {
		var p readapi.CatalogPage
		require.NoError(t, f.acme.Call(context.Background(), readapi.OpCatalog, readapi.Request{Kind: readapi.KindActions}, &p))
		require.Len(t, p.Actions, 1)
		assert.Contains(t, string(p.Actions[0]), `"test.echo"`)
	})
	assert.Equal(t, before, consumers(t, f.srv), "a read created a consumer")
}

func TestAReadOfAnotherTenantsRunIsNotFound(t *testing.T) {
	f := newFixture(t)
	_, err := scanAll(t, f.acme, readapi.OpEvents, readapi.Request{Run: f.glRun})
	assert.Equal(t, actionbus.CodeRunNotFound, code(err), "%v", err)
	_, err = scanAll(t, f.acme, readapi.OpEvents, readapi.Request{Run: f.glRun, Stream: readapi.StreamRequests})
	assert.Equal(t, actionbus.CodeRunNotFound, code(err), "%v", err)
	var p readapi.Page
	require.NoError(t, f.acme.Call(context.Background(), readapi.OpEvents,
		readapi.Request{Run: f.glRun, Verbs: []string{"completed"}, Last: true}, &p))
	assert.Empty(t, p.Msgs, "globex's terminal event")
	msgs, err := scanAll(t, f.acme, readapi.OpAudit, readapi.Request{Run: f.glRun})
	require.NoError(t, err)
	assert.Empty(t, msgs, "globex's audit records")
	msgs, err = scanAll(t, f.acme, readapi.OpRuns, readapi.Request{})
	require.NoError(t, err)
	for _, m := range msgs {
		assert.NotContains(t, m.Subject, f.glRun)
	}
	// globex reads its own.
	_, err = scanAll(t, f.globex, readapi.OpEvents, readapi.Request{Run: f.glRun})
	assert.NoError(t, err)
}

func TestTheReadServiceRefusesWhatIsNotTheDocumentedRequest(t *testing.T) {
	f := newFixture(t)
	nc := f.srv.Connect(t)
	ask := func(subject, body string) actionbus.Code {
		msg, err := nc.Request(subject, []byte(body), 5*time.Second)
		require.NoError(t, err)
		var abErr actionbus.Error
		if msg.Header.Get("Nats-Service-Error-Code") == "" {
			return ""
		}
		require.NoError(t, json.Unmarshal(msg.Data, &abErr))
		assert.Equal(t, string(abErr.Code), msg.Header.Get("Nats-Service-Error-Code"))
		return abErr.Code
	}
	for _, tc := range []struct {
		name, subject, body string
		want                actionbus.Code
	}{
		{"a run id that is not a ULID", "ab.api.acme.events", `{"run":"not-a-ulid"}`, actionbus.CodeInvalidRunID},
		{"a wildcard run id", "ab.api.acme.events", `{"run":"*"}`, actionbus.CodeInvalidRunID},
		{"a subject in the verb", "ab.api.acme.events", `{"run":"` + f.acmeRun + `","verbs":[">"]}`, actionbus.CodeBadRequest},
		{"an unknown verb", "ab.api.acme.events", `{"run":"` + f.acmeRun + `","verbs":["sched"]}`, actionbus.CodeBadRequest},
		{"a subject field", "ab.api.acme.events", `{"run":"` + f.acmeRun + `","subject":"ab.run.globex.>"}`, actionbus.CodeBadRequest},
		{"a tenant that is not one", "ab.api.ACME.events", `{"run":"` + f.acmeRun + `"}`, actionbus.CodeInvalidTenant},
		{"a reserved tenant", "ab.api.auditor.runs", `{}`, ""},
		{"no JSON", "ab.api.acme.runs", `{`, actionbus.CodeBadRequest},
		{"an artifact id that is not one", "ab.api.acme.artifact", `{"id":"../x"}`, actionbus.CodeArtifactNotFound},
		{"a skill name with a wildcard", "ab.api.acme.catalog", `{"kind":"skills","name":"*"}`, actionbus.CodeSkillNotFound},
		{"a valid read", "ab.api.acme.events", `{"run":"` + f.acmeRun + `"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if tc.subject == "ab.api.auditor.runs" && events.CheckTenant("auditor") != nil {
				want = actionbus.CodeInvalidTenant // once reserved names are refused
			}
			assert.Equal(t, want, ask(tc.subject, tc.body))
		})
	}
}

func TestALargeArtifactIsReadInChunksAndReassemblesExactly(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{Register: registerEcho})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := artifacts.Open(ctx, srv.JS, bus.Topology{}.BucketArtifacts())
	require.NoError(t, err)
	data := make([]byte, 3<<20+12345) // three times the max payload and more
	for i := range data {
		data[i] = byte(i*7 + i/251)
	}
	id := events.NewID()
	_, err = artifacts.Put(ctx, store, artifacts.Owner{Tenant: "acme", RunID: events.NewID()}, id, "output", "application/octet-stream", data, 0)
	require.NoError(t, err)

	acme, err := client.New(srv.Connect(t), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	got, sum, err := acme.Artifact(ctx, id)
	require.NoError(t, err)
	want := sha256.Sum256(data)
	assert.Equal(t, want, sha256.Sum256(got))
	assert.Len(t, got, len(data))
	assert.NotEmpty(t, sum)

	globex, err := client.New(srv.Connect(t), client.Options{Tenant: "globex"})
	require.NoError(t, err)
	_, _, err = globex.Artifact(ctx, id)
	assert.Equal(t, actionbus.CodeArtifactNotFound, code(err), "%v", err)
	_, _, err = acme.Artifact(ctx, events.NewID())
	assert.Equal(t, actionbus.CodeArtifactNotFound, code(err), "%v", err)
}

func TestAnEventOverAPageIsCutAndReassembled(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{Register: registerEcho})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := srv.Connect(t)
	c, err := client.New(nc, client.Options{Tenant: "acme"})
	require.NoError(t, err)
	text := strings.Repeat("0123456789abcdef", 2000) // 32 000 bytes: eight pages of 4 KiB
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.echo", Args: map[string]any{"text": text}}}, nil)
	require.NoError(t, err)
	acme := readapi.NewCaller(nc, "", "acme")
	req := readapi.Request{Run: res.RunID, Stream: readapi.StreamRequests}
	whole, err := scanAll(t, acme, readapi.OpEvents, req)
	require.NoError(t, err)
	require.Len(t, whole, 1)
	require.Greater(t, len(whole[0].Data), 32000)

	small := req
	small.MaxBytes = readapi.MinPageBytes
	var first readapi.Page
	require.NoError(t, acme.Call(ctx, readapi.OpEvents, small, &first))
	require.Len(t, first.Msgs, 1)
	assert.True(t, first.Msgs[0].Cut(), "a 32 kB event in a 4 KiB page")
	assert.Less(t, len(first.Msgs[0].Data), readapi.MinPageBytes)

	var cut []readapi.Msg
	_, err = acme.Scan(ctx, readapi.OpEvents, small, func(m readapi.Msg) bool { cut = append(cut, m); return true })
	require.NoError(t, err)
	require.Len(t, cut, 1)
	assert.Equal(t, whole[0].Seq, cut[0].Seq)
	assert.Equal(t, sha256.Sum256(whole[0].Data), sha256.Sum256(cut[0].Data))
	assert.False(t, cut[0].Cut())
}

func TestSkillsAreListedFromTheCatalog(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{Register: registerEcho})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketCatalog())
	require.NoError(t, err)
	for _, name := range []string{"writer", "reviewer"} {
		require.NoError(t, skillstore.Publish(ctx, kv, skills.Skill{Name: name, Description: "The " + name + ".", Pool: "default",
			Instructions: "Do it."}))
	}
	c, err := client.New(srv.Connect(t), client.Options{})
	require.NoError(t, err)
	list, err := c.Skills(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, "reviewer", list[0].Name)
	s, err := c.Skill(ctx, "writer")
	require.NoError(t, err)
	assert.Equal(t, "The writer.", s.Description)
	_, err = c.Skill(ctx, "nobody")
	assert.ErrorIs(t, err, actionbus.ErrSkillNotFound)
}

type noActions struct{}

func (noActions) List() []actions.Entry { return nil }

// TestSeveralInstancesAnswerEachRequestOnce: the read services of several
// dispatchers form one queue group.
func TestSeveralInstancesAnswerEachRequestOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	for range 2 {
		s, err := readapi.New(srv.Connect(t), readapi.Config{Catalog: noActions{}})
		require.NoError(t, err)
		require.NoError(t, s.Start())
		t.Cleanup(s.Stop)
	}
	nc := srv.Connect(t)
	caller := readapi.NewCaller(nc, "", "acme")
	const n = 20
	for range n {
		var p readapi.CatalogPage
		require.NoError(t, caller.Call(context.Background(), readapi.OpCatalog, readapi.Request{Kind: readapi.KindActions}, &p))
	}
	// A service counts a request after its answer is sent, so the last
	// answer can reach the caller before its count: the stats are read
	// until they have every request, or for five seconds.
	total := 0
	for deadline := time.Now().Add(5 * time.Second); total != n && time.Now().Before(deadline); {
		total = answered(t, nc)
	}
	assert.Equal(t, n, total, "requests answered by the two instances")
}

// answered sums the catalog requests the read service's instances report
// answered (both must answer the stats request).
func answered(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, nc.PublishRequest("$SRV.STATS."+readapi.ServiceName, inbox, nil))
	total := 0
	for range 2 {
		msg, err := sub.NextMsg(5 * time.Second)
		require.NoError(t, err)
		var stats micro.Stats
		require.NoError(t, json.Unmarshal(msg.Data, &stats))
		for _, e := range stats.Endpoints {
			if e.Name == readapi.OpCatalog {
				total += e.NumRequests
				assert.Equal(t, readapi.QueueGroup, e.QueueGroup)
			}
		}
	}
	return total
}
