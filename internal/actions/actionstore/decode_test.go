package actionstore_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
)

// validEntry is the entry the registrar writes for a read action of pool
// default, as its JSON object.
func validEntry(t testing.TB) map[string]any {
	def := actions.Definition{Name: "docs.search", Description: "Search the docs.", Pool: "default",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}}}`)}
	require.NoError(t, def.Normalize())
	b, err := json.Marshal(actions.Entry{Definition: def, Hash: def.Hash(), PublishedAt: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC), PublishedBy: "ex-1"})
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// rehash sets m's hash to the hash of its other members (as a writer who
// knows the formula would).
func rehash(t testing.TB, m map[string]any) map[string]any {
	b, err := json.Marshal(m)
	require.NoError(t, err)
	h, err := actions.EntryHash(b)
	require.NoError(t, err)
	m["hash"] = h
	return m
}

// TestDecodeEntryRefusesWhatTheProtocolRefuses: docs/protocol.md R-CATALOG
// and R-HASH. Each row changes the valid entry one way; every refusal is
// invalid_record naming the record kind and key.
func TestDecodeEntryRefusesWhatTheProtocolRefuses(t *testing.T) {
	const key = "default.docs.search"
	cases := []struct {
		name   string
		change func(m map[string]any) map[string]any
		key    string
		want   string // "" accepts; else a fragment of the error
	}{
		{"the registrar's entry", func(m map[string]any) map[string]any { return m }, key, ""},
		{"no hash", func(m map[string]any) map[string]any { delete(m, "hash"); return m }, key, "hash"},
		{"a bogus hash", func(m map[string]any) map[string]any { m["hash"] = strings.Repeat("0", 64); return m }, key, "is not the hash of its definition"},
		{"a hash not hex", func(m map[string]any) map[string]any { m["hash"] = "sha256:abc"; return m }, key, "/hash"},
		{"a changed description, old hash", func(m map[string]any) map[string]any { m["description"] = "Delete the docs."; return m }, key, "is not the hash"},
		{"a hash in upper case", func(m map[string]any) map[string]any { m["hash"] = strings.ToUpper(m["hash"].(string)); return m }, key, "/hash"},
		{"no description", func(m map[string]any) map[string]any { delete(m, "description"); return rehash(t, m) }, key, "description"},
		{"no input schema, planner-visible", func(m map[string]any) map[string]any { delete(m, "inputSchema"); return rehash(t, m) }, key, "inputSchema"},
		{"no input schema, hidden", func(m map[string]any) map[string]any {
			delete(m, "inputSchema")
			m["planner"] = map[string]any{"hidden": true}
			return rehash(t, m)
		}, key, ""},
		{"no input schema, opted out", func(m map[string]any) map[string]any {
			delete(m, "inputSchema")
			m["planner"] = map[string]any{"argsSchemaOptOut": "takes free text"}
			return rehash(t, m)
		}, key, ""},
		{"an input schema that does not compile", func(m map[string]any) map[string]any {
			m["inputSchema"] = map[string]any{"type": "objekt"}
			return rehash(t, m)
		}, key, "invalid_record"},
		{"no permission", func(m map[string]any) map[string]any { delete(m, "permission"); return rehash(t, m) }, key, "permission"},
		{"a mutate action not needing approval", func(m map[string]any) map[string]any {
			m["mode"] = "mutate"
			return rehash(t, m)
		}, key, "its permission is not the one"},
		{"an unknown member", func(m map[string]any) map[string]any { m["runAs"] = "root"; return rehash(t, m) }, key, "runAs"},
		{"an unknown mode", func(m map[string]any) map[string]any { m["mode"] = "admin"; return rehash(t, m) }, key, "/mode"},
		{"a tier out of range", func(m map[string]any) map[string]any { m["tier"] = 4; return rehash(t, m) }, key, "/tier"},
		{"no publishedAt", func(m map[string]any) map[string]any { delete(m, "publishedAt"); return m }, key, "publishedAt"},
		{"under another pool's key", func(m map[string]any) map[string]any { return m }, "payments.docs.search", "its key is not"},
		{"under another name's key", func(m map[string]any) map[string]any { return m }, "default.docs.other", "its key is not"},
		{"a bad tenant", func(m map[string]any) map[string]any { m["tenants"] = []string{"ACME"}; return rehash(t, m) }, key, "/tenants/0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := json.Marshal(c.change(validEntry(t)))
			require.NoError(t, err)
			e, err := actionstore.DecodeEntry(c.key, b)
			if c.want == "" {
				require.NoError(t, err)
				assert.Equal(t, "docs.search", e.Name)
				return
			}
			require.ErrorIs(t, err, actionbus.ErrInvalidRecord)
			assert.Contains(t, err.Error(), c.want)
			var typed *actionbus.Error
			require.ErrorAs(t, err, &typed)
			assert.Equal(t, "catalog_entry", typed.Details["record"])
			assert.Equal(t, c.key, typed.Details["key"])
		})
	}
}

// TestEntryHashIsTheDefinitionsHash: the hash any language computes from
// the stored entry (RFC 8785 form without hash, publishedAt, publishedBy)
// is the one the registrar writes, Definition.Hash, whatever the member
// order or spacing of the stored JSON.
func TestEntryHashIsTheDefinitionsHash(t *testing.T) {
	m := validEntry(t)
	b, err := json.MarshalIndent(m, "", "    ")
	require.NoError(t, err)
	h, err := actions.EntryHash(b)
	require.NoError(t, err)
	assert.Equal(t, m["hash"], h)
	m["publishedBy"], m["publishedAt"] = "someone-else", "2030-01-01T00:00:00Z"
	b, _ = json.Marshal(m)
	h2, err := actions.EntryHash(b)
	require.NoError(t, err)
	assert.Equal(t, h, h2, "who published it and when are not hashed")
	_, err = actions.EntryHash([]byte(`[1]`))
	assert.Error(t, err)
}

// FuzzDecodeEntry: the catalog's one read path never panics, and what it
// accepts is an entry whose key, hash and schema hold.
func FuzzDecodeEntry(f *testing.F) {
	valid, _ := json.Marshal(validEntry(f))
	f.Add("default.docs.search", valid)
	f.Add("default.docs.search", []byte(`{}`))
	f.Add("default.docs.search", []byte(`null`))
	f.Add("x.y", []byte(`{"name":"y","pool":"x","hash":"`+strings.Repeat("a", 64)+`"}`))
	f.Add("default.docs.search", []byte(strings.Replace(string(valid), `"tier":0`, `"tier":0.0`, 1)))
	f.Fuzz(func(t *testing.T, key string, val []byte) {
		e, err := actionstore.DecodeEntry(key, val)
		if err != nil {
			assert.ErrorIs(t, err, actionbus.ErrInvalidRecord)
			return
		}
		assert.Equal(t, key, actions.CatalogKey(e.Pool, e.Name))
		h, herr := actions.EntryHash(val)
		require.NoError(t, herr)
		assert.Equal(t, h, e.Hash)
	})
}
