package bus_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

func TestSamplesCoverCatalog(t *testing.T) {
	for _, e := range events.Catalog {
		_, ok := samples[e.Type]
		assert.True(t, ok, "no sample data for %s", e.Type)
	}
	assert.Len(t, samples, len(events.Catalog))
}

// normalize renders a value as generic JSON so that typed values and values
// decoded from msgpack compare equal.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func newEvent(t *testing.T, typ, contentType string, data any) *event.Event {
	t.Helper()
	e := event.New()
	e.SetID(events.NewID())
	e.SetType(typ)
	e.SetSource("/actionbus/test")
	e.SetTime(time.Date(2026, 11, 30, 9, 1, 2, 345678900, time.UTC))
	e.SetSubject("subject with spaces and ünïcode")
	e.SetExtension(events.ExtRunID, sampleRun)
	e.SetExtension("planindex", 3)
	require.NoError(t, events.SetData(&e, contentType, data))
	require.NoError(t, events.Validate(&e))
	return &e
}

func TestRoundTripEveryTypeBothModesBothCodecs(t *testing.T) {
	for _, entry := range events.Catalog {
		for _, mode := range []bus.Mode{bus.ModeBinary, bus.ModeStructured} {
			for _, ct := range []string{events.ContentTypeJSON, events.ContentTypeMsgpack} {
				t.Run(entry.Type+"/"+mode.String()+"/"+ct, func(t *testing.T) {
					in := newEvent(t, entry.Type, ct, samples[entry.Type])
					msg, err := bus.Encode("ab.test", in, mode)
					require.NoError(t, err)
					assert.Equal(t, in.ID(), msg.Header.Get(bus.HeaderMsgID))
					assert.Equal(t, mode == bus.ModeStructured, bus.IsStructured(msg.Header))

					out, err := bus.Decode(msg.Subject, msg.Header, msg.Data)
					require.NoError(t, err)
					require.NoError(t, events.Validate(out))
					assert.Equal(t, in.ID(), out.ID())
					assert.Equal(t, in.Type(), out.Type())
					assert.Equal(t, in.Source(), out.Source())
					assert.Equal(t, in.Subject(), out.Subject())
					assert.True(t, in.Time().Equal(out.Time()), "time %v != %v", in.Time(), out.Time())
					assert.Equal(t, in.DataContentType(), out.DataContentType())
					assert.Equal(t, sampleRun, out.Extensions()[events.ExtRunID])

					got := entry.New()
					require.NoError(t, events.DataAs(out, got))
					assert.Equal(t, normalize(t, samples[entry.Type]), normalize(t, got))
				})
			}
		}
	}
}

// The binding's own examples (NATS protocol binding, sections 3.1.3.2,
// 3.1.4 and 3.2.1).
func TestBindingSpecBinaryExample(t *testing.T) {
	h := nats.Header{
		"ce-specversion":     {"1.0"},
		"ce-type":            {"com.example.someevent"},
		"ce-time":            {"2018-04-05T03:56:24Z"},
		"ce-id":              {"1234-1234-1234"},
		"ce-source":          {"/mycontext/subcontext"},
		"ce-datacontenttype": {"application/json"},
	}
	e, err := bus.Decode("mySubject", h, []byte(`{"hello":"world"}`))
	require.NoError(t, err)
	assert.Equal(t, "1.0", e.SpecVersion())
	assert.Equal(t, "com.example.someevent", e.Type())
	assert.Equal(t, "1234-1234-1234", e.ID())
	assert.Equal(t, "/mycontext/subcontext", e.Source())
	assert.Equal(t, "application/json", e.DataContentType())
	assert.True(t, time.Date(2018, 4, 5, 3, 56, 24, 0, time.UTC).Equal(e.Time()))
	assert.JSONEq(t, `{"hello":"world"}`, string(e.Data()))

	// Encoding the same event gives the same headers back.
	msg, err := bus.Encode("mySubject", e, bus.ModeBinary)
	require.NoError(t, err)
	for k, v := range h {
		assert.Equal(t, v, msg.Header[k], k)
	}
	assert.Empty(t, msg.Header.Get("Content-Type"), "binary mode must not set Content-Type")
}

func TestBindingSpecStructuredExample(t *testing.T) {
	body := `{
		"specversion" : "1.0",
		"type" : "com.example.someevent",
		"id" : "A234-1234-1234",
		"source" : "/mycontext",
		"datacontenttype" : "application/json",
		"data" : { "appinfoA" : "abc" }
	}`
	for _, ct := range []string{"application/cloudevents+json", "application/cloudevents", "APPLICATION/CloudEvents+JSON; charset=UTF-8"} {
		for _, key := range []string{"Content-Type", "content-type"} {
			e, err := bus.Decode("mySubject", nats.Header{key: {ct}}, []byte(body))
			require.NoError(t, err, ct)
			assert.Equal(t, "com.example.someevent", e.Type())
			assert.Equal(t, "A234-1234-1234", e.ID())
			assert.JSONEq(t, `{"appinfoA":"abc"}`, string(e.Data()))
		}
	}
}

func TestBindingSpecPercentEncodingExample(t *testing.T) {
	assert.Equal(t, "Euro%20%E2%82%AC%20%F0%9F%98%80", bus.PercentEncode("Euro € 😀"))
	assert.Equal(t, `%22quoted%22%25`, bus.PercentEncode(`"quoted"%`))
	assert.Equal(t, "plain-ascii_/:~!", bus.PercentEncode("plain-ascii_/:~!"))
	assert.Equal(t, "a%0Ab%7F", bus.PercentEncode("a\nb\x7f"))
}

func TestDecodeHeaderValue(t *testing.T) {
	cases := []struct {
		name, in, want string
		wantErr        bool
	}{
		{"spec example", "Euro%20%E2%82%AC%20%F0%9F%98%80", "Euro € 😀", false},
		{"lower-case hex accepted", "Euro%20%e2%82%ac", "Euro €", false},
		{"unnecessarily encoded accepted", "%41%42c", "ABc", false},
		{"overlong encoding rejected", "%C0%A0", "", true},
		{"invalid UTF-8 rejected", "%FF", "", true},
		{"truncated escape", "abc%2", "", true},
		{"non-hex escape", "abc%zz", "", true},
		{"double-quoted value (older senders)", `"hello world"`, "hello world", false},
		{"backslash escape in quotes", `"say \"hi\""`, `say "hi"`, false},
		{"quoted then percent-decoded", `"a%20b"`, "a b", false},
		{"unterminated quote", `"abc`, "", true},
		{"surrounding whitespace trimmed", "  x  ", "x", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := bus.DecodeHeaderValue(c.in)
			if c.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestDecodeHeaderNamesCaseInsensitive(t *testing.T) {
	h := nats.Header{"CE-SpecVersion": {"1.0"}, "Ce-Id": {"1"}, "ce-SOURCE": {"/s"}, "ce-type": {"t"}, "CE-RUNID": {"r1"}}
	e, err := bus.Decode("s", h, nil)
	require.NoError(t, err)
	assert.Equal(t, "1", e.ID())
	assert.Equal(t, "r1", e.Extensions()["runid"])
}

func TestDecodeRejectsMalformed(t *testing.T) {
	ok := func() nats.Header {
		return nats.Header{"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"/s"}, "ce-type": {events.TypeRunStarted}}
	}
	cases := []struct {
		name   string
		header func() nats.Header
		body   string
		code   actionbus.Code
	}{
		{"no cloudevent headers", func() nats.Header { return nats.Header{"X": {"y"}} }, `{}`, actionbus.CodeMalformedEvent},
		{"unsupported specversion", func() nats.Header { h := ok(); h["ce-specversion"] = []string{"0.3"}; return h }, `{}`, actionbus.CodeMalformedEvent},
		{"missing id", func() nats.Header { h := ok(); delete(h, "ce-id"); return h }, `{}`, actionbus.CodeMalformedEvent},
		{"missing source", func() nats.Header { h := ok(); delete(h, "ce-source"); return h }, `{}`, actionbus.CodeMalformedEvent},
		{"bad time", func() nats.Header { h := ok(); h["ce-time"] = []string{"yesterday"}; return h }, `{}`, actionbus.CodeMalformedEvent},
		{"bad percent escape", func() nats.Header { h := ok(); h["ce-source"] = []string{"%G1"}; return h }, `{}`, actionbus.CodeMalformedEvent},
		{"two values for one attribute", func() nats.Header { h := ok(); h["ce-id"] = []string{"1", "2"}; return h }, `{}`, actionbus.CodeMalformedEvent},
		{"same attribute in two headers", func() nats.Header { h := ok(); h["CE-ID"] = []string{"2"}; return h }, `{}`, actionbus.CodeMalformedEvent},
		{"extension name with upper case", func() nats.Header { h := ok(); h["ce-Run_Id"] = []string{"x"}; return h }, `{}`, actionbus.CodeMalformedEvent},
		{"structured but not JSON", func() nats.Header { return nats.Header{"Content-Type": {"application/cloudevents+json"}} }, `{nope`, actionbus.CodeMalformedEvent},
		{"structured in an unsupported format", func() nats.Header { return nats.Header{"Content-Type": {"application/cloudevents+avro"}} }, `{}`, actionbus.CodeUnsupportedContent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := bus.Decode("s", c.header(), []byte(c.body))
			require.Error(t, err)
			assert.Equal(t, c.code, actionbus.CodeOf(err), "err: %v", err)
		})
	}
}

func TestValidateRejects(t *testing.T) {
	good := newEvent(t, events.TypeRunStarted, events.ContentTypeJSON, samples[events.TypeRunStarted])
	cases := []struct {
		name   string
		mutate func(e *event.Event)
		code   actionbus.Code
	}{
		{"unknown type", func(e *event.Event) { e.SetType("io.actionbus.nope.happened") }, actionbus.CodeUnknownEventType},
		{"schema violation: missing required", func(e *event.Event) { e.DataEncoded = []byte(`{"runId":"r1"}`) }, actionbus.CodeSchemaValidation},
		{"schema violation: wrong enum", func(e *event.Event) { e.DataEncoded = []byte(`{"runId":"r1","kind":"batch"}`) }, actionbus.CodeSchemaValidation},
		{"schema violation: unknown field", func(e *event.Event) { e.DataEncoded = []byte(`{"runId":"r1","kind":"agent","x":1}`) }, actionbus.CodeSchemaValidation},
		{"unsupported datacontenttype", func(e *event.Event) { e.SetDataContentType("text/plain") }, actionbus.CodeUnsupportedContent},
		{"msgpack content type over JSON bytes", func(e *event.Event) { e.SetDataContentType(events.ContentTypeMsgpack) }, actionbus.CodeMalformedEvent},
		{"no data", func(e *event.Event) { e.DataEncoded = nil }, actionbus.CodeMalformedEvent},
		{"trailing JSON", func(e *event.Event) { e.DataEncoded = []byte(`{"runId":"r1","kind":"agent"} {}`) }, actionbus.CodeSchemaValidation},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := good.Clone()
			c.mutate(&e)
			err := events.Validate(&e)
			require.Error(t, err)
			assert.Equal(t, c.code, actionbus.CodeOf(err), "err: %v", err)
		})
	}

	t.Run("truncated msgpack", func(t *testing.T) {
		e := newEvent(t, events.TypeRunStarted, events.ContentTypeMsgpack, samples[events.TypeRunStarted])
		e.DataEncoded = e.DataEncoded[:len(e.DataEncoded)-3]
		err := events.Validate(e)
		require.Error(t, err)
		assert.Equal(t, actionbus.CodeMalformedEvent, actionbus.CodeOf(err))
	})
}

func TestSchemaViolationNamesThePath(t *testing.T) {
	e := newEvent(t, events.TypeRunRequested, events.ContentTypeJSON, samples[events.TypeRunRequested])
	e.DataEncoded = []byte(`{"runId":"r1","allowedModes":["read","destroy"]}`)
	err := events.Validate(e)
	var abErr *actionbus.Error
	require.ErrorAs(t, err, &abErr)
	assert.Contains(t, abErr.Message, "/allowedModes/1")
}

func TestDerivedIDIsDeterministicAndAValidULID(t *testing.T) {
	run := events.NewID()
	a := events.DerivedID(run, "action", 1, 2, 1)
	assert.Equal(t, a, events.DerivedID(run, "action", 1, 2, 1))
	assert.NotEqual(t, a, events.DerivedID(run, "action", 1, 3, 1))
	assert.NotEqual(t, a, events.DerivedID(run, "action", 12, 1))
	assert.Len(t, a, 26)
	assert.Equal(t, run[:10], a[:10], "derived ids keep the cause's timestamp")
	assert.NotEqual(t, events.NewID(), events.NewID())
}

func TestSubjectsFollowConventions(t *testing.T) {
	s := events.MustSubjects("ab")
	for _, entry := range events.Catalog {
		if entry.Type == events.TypeEventRejected || entry.Type == events.TypeAuditRecorded || entry.Type == events.TypeAuditAppended {
			continue
		}
		subj, err := s.SubjectFor(entry.Type, events.DefaultTenant, "R1", "default")
		require.NoError(t, err)
		want := entry.Subject
		for _, r := range [][2]string{{"{prefix}", "ab"}, {"{tenant}", "default"}, {"{runId}", "R1"}, {"{pool}", "default"}} {
			want = strings.ReplaceAll(want, r[0], r[1])
		}
		assert.Equal(t, want, subj, entry.Type)
	}
	assert.Equal(t, "R1", s.RunIDFromSubject("ab.run.acme.R1.requested"))
	tenant, id := s.RunFromSubject("ab.run.acme.R1.sched.run")
	assert.Equal(t, [2]string{"acme", "R1"}, [2]string{tenant, id})
	assert.Equal(t, "", s.RunIDFromSubject("ab.run.R1"))
	assert.Equal(t, "", s.RunIDFromSubject("ab.pool.default.request"))
	_, err := s.SubjectFor(events.TypeRunStarted, "Acme", "R1", "")
	assert.ErrorIs(t, err, actionbus.ErrInvalidTenant, "a tenant that is not a safe token is refused")
	_, err = events.NewSubjects("a.*")
	assert.Error(t, err)
}

// Event data is encoded and decoded with go-json; it must write what
// encoding/json writes, and read back what encoding/json reads, for every
// type of the catalog.
func TestEventDataIsEncodedAsEncodingJSONDoes(t *testing.T) {
	for typ, v := range samples {
		t.Run(typ, func(t *testing.T) {
			e := event.New()
			require.NoError(t, events.SetData(&e, events.ContentTypeJSON, v))
			want, err := json.Marshal(v)
			require.NoError(t, err)
			assert.Equal(t, string(want), string(e.Data()), "the same bytes as encoding/json")

			got := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			require.NoError(t, events.DataAs(&e, got))
			ref := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			require.NoError(t, json.Unmarshal(want, ref))
			assert.Equal(t, ref, got, "the same value as encoding/json decodes")
		})
	}
}
