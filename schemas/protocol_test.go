package schemas_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/schema"
	"github.com/actionbus/actionbus/schemas"
)

func protocolDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/protocol.md")
	require.NoError(t, err)
	return string(b)
}

var (
	schemaRef  = regexp.MustCompile(`schemas/([A-Za-z0-9._-]+\.json)`)
	ruleDef    = regexp.MustCompile(`(?m)^\*\*([ECR]-[A-Z0-9]+(?:-[A-Z0-9]+)*)\.\*\*`)
	ruleRef    = regexp.MustCompile(`\b([ECR]-[A-Z]{2,}(?:-[A-Z]+)*)\b`)
	exampleRef = regexp.MustCompile("(?s)<!-- schema: ([A-Za-z0-9._-]+\\.json) -->\\s*```json\\n(.*?)```")
)

// The rule ids every helper of issue 40 shares (the conformance kit
// prints them): each is defined in docs/protocol.md.
var sharedRules = []string{
	"E-ANNOUNCE", "E-PULL", "E-INPUT", "E-UNKNOWN-ACTION", "E-TENANT", "E-HEARTBEAT", "E-TIMEOUT", "E-CANCEL",
	"E-RESULT", "E-RESULT-ID", "E-ACK", "E-REDELIVERY", "E-OUTPUT", "E-ARTIFACT", "E-IDEMPOTENCY", "E-APPROVAL",
	"E-REJECT", "E-SHUTDOWN",
	"C-START", "C-FOLLOW", "C-WAIT", "C-ANSWER", "C-APPROVE", "C-AUDIT",
}

// TestProtocolDocIsHonest keeps docs/protocol.md honest: every schema it
// names is a file of schemas/ that compiles; every rule id is defined
// once, every id it mentions is defined, and the shared ids are all
// there; every example marked <!-- schema: NAME --> validates against
// NAME, and the catalog entry's example is one the catalog accepts (its
// hash is R-HASH's).
func TestProtocolDocIsHonest(t *testing.T) {
	doc := protocolDoc(t)
	set := schema.NewSet()
	require.NoError(t, set.AddFS(schemas.FS, schemas.BaseURL))
	compiled := map[string]*schema.Compiled{}
	compile := func(name string) *schema.Compiled {
		if c, ok := compiled[name]; ok {
			return c
		}
		_, err := schemas.FS.Open(name)
		require.NoError(t, err, "docs/protocol.md names schemas/%s, which does not exist", name)
		c, err := set.Compile(schemas.BaseURL + name)
		require.NoError(t, err, "schemas/%s does not compile", name)
		compiled[name] = c
		return c
	}
	for _, m := range schemaRef.FindAllStringSubmatch(doc, -1) {
		compile(m[1])
	}
	for _, name := range []string{schemas.ActionDefinition, schemas.CatalogEntry, schemas.IdempotencyRecord, schemas.Presence} {
		assert.Contains(t, doc, "schemas/"+name, "the record schema %s is named in docs/protocol.md", name)
	}

	defined := map[string]int{}
	for _, m := range ruleDef.FindAllStringSubmatch(doc, -1) {
		defined[m[1]]++
	}
	for id, n := range defined {
		assert.Equal(t, 1, n, "rule %s is defined %d times", id, n)
	}
	for _, id := range sharedRules {
		assert.Contains(t, defined, id, "shared rule %s is not defined", id)
	}
	for _, m := range ruleRef.FindAllStringSubmatch(doc, -1) {
		assert.Contains(t, defined, m[1], "rule %s is mentioned but not defined", m[1])
	}

	examples := exampleRef.FindAllStringSubmatch(doc, -1)
	require.GreaterOrEqual(t, len(examples), 8, "the marked examples")
	entries := 0
	for _, m := range examples {
		name, body := m[1], []byte(m[2])
		assert.NoError(t, compile(name).ValidateJSON(body), "the example of %s", name)
		if name != schemas.CatalogEntry {
			continue
		}
		entries++
		var e struct{ Pool, Name string }
		require.NoError(t, json.Unmarshal(body, &e))
		want, err := actions.EntryHash(body)
		require.NoError(t, err)
		_, err = actionstore.DecodeEntry(actions.CatalogKey(e.Pool, e.Name), body)
		assert.NoError(t, err, "the catalog entry example is refused (its hash should be %s)", want)
	}
	assert.Equal(t, 1, entries, "one catalog entry example")
}

// TestProtocolResultIDExample: the worked examples of E-RESULT-ID are
// what events.ResultID computes, step by step.
func TestProtocolResultIDExample(t *testing.T) {
	doc := protocolDoc(t)
	cases := []struct {
		callID  string
		attempt int
		digest  string
		id      string
	}{
		{"01JDQ2V7XH3M8Q5T9W4Z6B1C0E", 2, "670aad5c58960fba2cddd7734da951f49c68733b0af50d9713647e54b7be7248", "01JDQ2V7XHCW5ATQ2RJR7VMB6X"},
		{"call-7", 1, "", "0000000000GSXDDY13XBKNH493"},
	}
	for _, c := range cases {
		assert.Equal(t, c.id, events.ResultID(c.callID, c.attempt))
		assert.Contains(t, doc, "`"+c.id+"`")
		assert.Contains(t, doc, c.callID)
		if c.digest == "" {
			continue
		}
		sum := sha256.Sum256([]byte(c.callID + "\x00result\x00" + "2"))
		assert.Equal(t, c.digest, hex.EncodeToString(sum[:]))
		assert.Contains(t, doc, c.digest)
		assert.Contains(t, doc, "`"+c.digest[:20]+"`", "the entropy bytes")
		assert.True(t, strings.HasPrefix(c.id, c.callID[:10]), "the id keeps the call id's timestamp")
	}
}

// TestProtocolArtifactIDExample: the worked artifact names of E-ARTIFACT
// are what the Go executor names an offloaded output
// (events.DerivedID(callId, "artifact", "output")), with the digest and
// entropy bytes the page shows.
func TestProtocolArtifactIDExample(t *testing.T) {
	doc := protocolDoc(t)
	cases := []struct{ callID, digest, id string }{
		{"01JDQ2V7XH3M8Q5T9W4Z6B1C0E", "22b61b760889615ade9cede2ab951a29c61be73c32a1eac6e33b88d76d332159", "01JDQ2V7XH4AV1PXG8H5GNNQMW"},
		{"call-7", "", "0000000000MTZ17V20K81788ZH"},
	}
	for _, c := range cases {
		assert.Equal(t, c.id, events.DerivedID(c.callID, "artifact", "output"))
		assert.Contains(t, doc, "`"+c.id+"`")
		if c.digest == "" {
			continue
		}
		sum := sha256.Sum256([]byte(c.callID + "\x00artifact\x00output"))
		assert.Equal(t, c.digest, hex.EncodeToString(sum[:]))
		assert.Contains(t, doc, c.digest)
		assert.Contains(t, doc, "`"+c.digest[:20]+"`", "the entropy bytes")
	}
}
