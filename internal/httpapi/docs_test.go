package httpapi_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// example is one curl example of docs/http.md and the answer shown after
// it.
type example struct {
	script, lang, answer string
}

var codeBlock = regexp.MustCompile("(?s)```(\\w+)\\n(.*?)```")

// examples reads the curl examples of the docs' Endpoints section.
func examples(t *testing.T) []example {
	doc, err := os.ReadFile("../../docs/http.md")
	require.NoError(t, err)
	text := string(doc)
	text = text[strings.Index(text, "## Endpoints"):]
	blocks := codeBlock.FindAllStringSubmatch(text, -1)
	var out []example
	for i := 0; i < len(blocks); i++ {
		if blocks[i][1] == "sh" && strings.Contains(blocks[i][2], "curl") && i+1 < len(blocks) {
			out = append(out, example{script: blocks[i][2], lang: blocks[i+1][1], answer: blocks[i+1][2]})
			i++
		}
	}
	return out
}

// matches checks an answer against the documented one: every documented
// key is there; statuses, codes, verdicts and kinds are equal; a
// documented non-empty list is not empty and its first item matches.
func matches(t *testing.T, where string, want, got any) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !assert.True(t, ok, "%s: want an object, got %v", where, got) {
			return
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !assert.True(t, ok, "%s: no %q in %v", where, k, g) {
				continue
			}
			switch k {
			case "status", "code", "verified", "complete", "kind", "action", "mode":
				assert.Equal(t, wv, gv, "%s.%s", where, k)
			default:
				matches(t, where+"."+k, wv, gv)
			}
		}
	case []any:
		g, ok := got.([]any)
		if !assert.True(t, ok, "%s: want a list, got %v", where, got) || len(w) == 0 {
			return
		}
		if assert.NotEmpty(t, g, where) {
			matches(t, where+"[0]", w[0], g[0])
		}
	}
}

// TestTheHTTPDocsExamplesRun runs every curl example of docs/http.md
// against a real server, in the docs' order, and checks each answer
// against the one the docs show.
func TestTheHTTPDocsExamplesRun(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("docs examples skipped: no curl on PATH (.ci/run installs it)")
	}
	a := newAPI(t)
	status, body := a.do(http.MethodPost, "/v1/runs?wait=20s", "runner", map[string]any{"action": map[string]any{"name": "inv.stock", "args": map[string]any{"sku": "A-1"}}})
	require.Equal(t, http.StatusOK, status, body)
	run := body["runId"].(string)
	pending := func(sku string) string { return a.pendingApproval(a.start(reorder(sku)))["approvalId"].(string) }
	approval, approval2 := pending("B-2"), pending("C-3")
	env := append(os.Environ(), "AB="+a.url, "TOKEN="+a.tokens["runner"], "APPROVER_TOKEN="+a.tokens["approver"],
		"RUN="+run, "APPROVAL="+approval, "APPROVAL2="+approval2, "PATH="+os.Getenv("PATH"))
	list := examples(t)
	require.GreaterOrEqual(t, len(list), 12, "the docs' examples")
	for i, ex := range list {
		cmd := exec.Command("sh", "-c", ex.script)
		cmd.Env = env
		out, err := cmd.Output()
		require.NoError(t, err, "example %d (%s): %s", i, curl, ex.script)
		where := strings.SplitN(strings.TrimSpace(ex.script), "\n", 2)[0]
		switch ex.lang {
		case "json":
			var want, got any
			require.NoError(t, json.Unmarshal([]byte(ex.answer), &want), "the docs' answer of %s", where)
			require.NoError(t, json.Unmarshal(out, &got), "%s answered %s", where, out)
			matches(t, where, want, got)
		case "text": // server-sent events: each documented event is there
			for _, line := range strings.Split(ex.answer, "\n") {
				if strings.HasPrefix(line, "event: ") {
					assert.Contains(t, string(out), line+"\n", where)
				}
			}
		}
	}
}
