package record_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/record"
	"github.com/actionbus/actionbus/schemas"
)

// TestRecordsAreValidatedAgainstTheirSchemas: R-PRESENCE and
// R-IDEMPOTENCY, table-tested; a failure is invalid_record naming the
// kind and the key.
func TestRecordsAreValidatedAgainstTheirSchemas(t *testing.T) {
	const done = `{"state":"done","callId":"c1","executor":"ex","reservedAt":"2026-12-03T14:00:00Z","timeoutMs":30000,` +
		`"action":"docs.get","tenant":"acme","userId":"ann","inputHash":"ab","output":{"n":1},"summary":"s","complete":false}`
	cases := []struct {
		name string
		kind record.Kind
		doc  string
		ok   bool
	}{
		{"presence as the Go executor writes it", record.Presence, `{"id":"ex-1","pool":"default","slots":8,"startedAt":"2026-12-03T14:00:00.123456Z"}`, true},
		{"presence without slots", record.Presence, `{"id":"ex-1","pool":"default","startedAt":"2026-12-03T14:00:00Z"}`, false},
		{"presence with no slot", record.Presence, `{"id":"ex-1","pool":"default","slots":0,"startedAt":"2026-12-03T14:00:00Z"}`, false},
		{"presence of a bad pool", record.Presence, `{"id":"ex-1","pool":"a.b","slots":1,"startedAt":"2026-12-03T14:00:00Z"}`, false},
		{"presence with more", record.Presence, `{"id":"ex-1","pool":"default","slots":1,"startedAt":"2026-12-03T14:00:00Z","admin":true}`, false},
		{"a done record", record.IdempotencyRecord, done, true},
		{"a reservation", record.IdempotencyRecord, `{"state":"reserved","callId":"c1","executor":"ex","reservedAt":"2026-12-03T14:00:00Z","timeoutMs":0,"action":"docs.get","inputHash":"ab"}`, true},
		{"a record of another state", record.IdempotencyRecord, `{"state":"replay","callId":"c1","executor":"ex","reservedAt":"2026-12-03T14:00:00Z","timeoutMs":0,"action":"docs.get","inputHash":"ab"}`, false},
		{"a record without its call", record.IdempotencyRecord, `{"state":"done","output":{"forged":true}}`, false},
		{"a record of a bad tenant", record.IdempotencyRecord, `{"state":"done","callId":"c1","executor":"ex","reservedAt":"2026-12-03T14:00:00Z","timeoutMs":0,"action":"docs.get","tenant":"ACME","inputHash":"ab"}`, false},
		{"not JSON", record.IdempotencyRecord, `{"state":`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := record.Validate(c.kind, "k.1", []byte(c.doc))
			if c.ok {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, actionbus.ErrInvalidRecord)
			var typed *actionbus.Error
			require.ErrorAs(t, err, &typed)
			assert.Equal(t, string(c.kind), typed.Details["record"])
			assert.Equal(t, "k.1", typed.Details["key"])
		})
	}
}

// FuzzValidate: validating any bytes as any record never panics, and a
// refusal is always invalid_record.
func FuzzValidate(f *testing.F) {
	f.Add(0, []byte(`{"id":"ex-1","pool":"default","slots":8,"startedAt":"2026-12-03T14:00:00Z"}`))
	f.Add(1, []byte(`{"state":"done","callId":"c1","executor":"ex","reservedAt":"2026-12-03T14:00:00Z","timeoutMs":1,"action":"a","inputHash":"ab"}`))
	f.Add(2, []byte(`{"name":"a","description":""}`))
	f.Add(3, []byte(`null`))
	kinds := []record.Kind{record.Presence, record.IdempotencyRecord, record.ActionDefinition, record.CatalogEntry}
	f.Fuzz(func(t *testing.T, k int, doc []byte) {
		if k < 0 {
			k = -k
		}
		err := record.Validate(kinds[k%len(kinds)], "key", doc)
		if err != nil {
			assert.ErrorIs(t, err, actionbus.ErrInvalidRecord)
		}
	})
}

// TestAPlantedIdempotencyRecordIsNeverReplayed: R-IDEMPOTENCY. A record
// that fails its schema, planted under a call's idempotency key (as a
// user with write access to the pool's bucket could), does not replay the
// output it holds: the call fails invalid_record and the handler does not
// run.
func TestAPlantedIdempotencyRecordIsNeverReplayed(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ran := make(chan struct{}, 1)
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, Register: func(ex *executor.Executor) error {
		type in struct {
			Q string `json:"q"`
		}
		return executor.Register(ex, executor.Action{Name: "docs.get", Description: "Get a doc."},
			func(_ context.Context, x in, _ executor.Call) (executor.Result[in], error) {
				ran <- struct{}{}
				return executor.Result[in]{Output: x}, nil
			})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketIdempotency(bus.DefaultPool))
	require.NoError(t, err)
	sum := sha256.Sum256([]byte("key-1"))
	_, err = kv.Put(ctx, bus.DefaultPool+".default."+hex.EncodeToString(sum[:]), []byte(`{"state":"done","output":{"forged":true}}`))
	require.NoError(t, err)

	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "docs.get", Args: map[string]any{"q": "x"}, IdempotencyKey: "key-1"}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.NotNil(t, res.Error)
	assert.Equal(t, actionbus.CodeInvalidRecord, res.Error.Code)
	assert.Empty(t, ran, "the handler did not run")
}

// TestTheDefinitionSchemaNamesEveryMemberOfTheGoType: the members of
// schemas/action-definition.json are exactly the JSON members of
// actions.Definition, so neither can gain one the other refuses.
func TestTheDefinitionSchemaNamesEveryMemberOfTheGoType(t *testing.T) {
	b, err := fs.ReadFile(schemas.FS, schemas.ActionDefinition)
	require.NoError(t, err)
	var doc struct {
		Properties map[string]any `json:"properties"`
		Defs       struct {
			Fields struct {
				Properties map[string]any `json:"properties"`
			} `json:"fields"`
		} `json:"$defs"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	var members []string
	typ := reflect.TypeFor[actions.Definition]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			members = append(members, name)
		}
	}
	assert.ElementsMatch(t, members, slices.Collect(maps.Keys(doc.Defs.Fields.Properties)))
	assert.ElementsMatch(t, members, slices.Collect(maps.Keys(doc.Properties)))
}

// TestTheGoExecutorsPresenceFollowsItsSchema: E-PRESENCE. What the Go
// executor puts in its pool's presence bucket validates against
// schemas/presence.json, under <pool>.<executor id>.
func TestTheGoExecutorsPresenceFollowsItsSchema(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, NoPlanner: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketPresence(bus.DefaultPool))
	require.NoError(t, err)
	var key string
	require.Eventually(t, func() bool {
		keys, err := kv.Keys(ctx)
		if err != nil || len(keys) == 0 {
			return false
		}
		key = keys[0]
		return true
	}, 10*time.Second, 20*time.Millisecond, "no executor put its presence")
	e, err := kv.Get(ctx, key)
	require.NoError(t, err)
	require.NoError(t, record.Validate(record.Presence, key, e.Value()), "%s", e.Value())
	var v struct{ ID, Pool string }
	require.NoError(t, json.Unmarshal(e.Value(), &v))
	assert.Equal(t, v.Pool+"."+v.ID, key)
}
