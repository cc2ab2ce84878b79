package workspace_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/workspace"
)

const report = `# Delivery report

## Summary

Three jobs failed.

## Failures

job_1041 failed.
job_1041 timed out.

## Next steps

Retry them.`

func newWS(t *testing.T) *workspace.Workspace {
	t.Helper()
	w, err := workspace.New(map[string]string{"report.md": report})
	require.Nil(t, err)
	return w
}

func ops(t *testing.T, raw string) []workspace.Op {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(raw), &v))
	out, err := workspace.ParseOps(v)
	require.Nil(t, err)
	return out
}

func TestProposeIsPreviewOnly(t *testing.T) {
	w := newWS(t)
	f := w.Files["report.md"]
	require.Equal(t, 1, f.Version)
	require.Equal(t, 1, w.Version)
	p, err := w.Propose("report.md", ops(t, `[{"type":"append","content":"## Owners\n\nThe delivery team owns the retries."}]`), "p1")
	require.Nil(t, err)
	assert.Equal(t, workspace.StatusReady, p.Status)
	assert.Equal(t, report, f.Content, "content unchanged")
	assert.Equal(t, 1, f.Version, "file version unchanged")
	assert.Equal(t, 1, w.Version, "workspace version unchanged")
	require.NotNil(t, w.Pending)
	assert.Equal(t, "p1", w.Pending.ID)
	assert.Equal(t, 1, p.BaseVersion)
	assert.True(t, p.Changed)
	assert.Equal(t, p.AfterWords-p.BeforeWords, p.DeltaWords)
	assert.Positive(t, p.DeltaWords)
	assert.Equal(t, 4, p.StructureBefore.Headings)
	assert.Equal(t, 5, p.StructureAfter.Headings)
	b, _ := json.Marshal(p)
	assert.NotContains(t, string(b), "owns the retries", "the proposal never carries the preview's text")
	assert.NotEmpty(t, p.PreviewSummary)
}

func TestEachOperationPreviews(t *testing.T) {
	for _, tc := range []struct {
		name, ops string
		want      string // a substring of the preview
		wantNot   string
	}{
		{"replace the one occurrence", `[{"type":"replace","find":"Three jobs failed.","replace":"Three delivery jobs failed on Monday, all in the north region."}]`,
			"all in the north region", "Three jobs failed."},
		{"replace_all", `[{"type":"replace","find":"job_1041","replace":"job 1041 (north)","replace_all":true}]`, "job 1041 (north) timed out", "job_1041"},
		{"append with a separator", `[{"type":"append","content":"Signed: ops team, on call this week.","separator":"\n\n---\n\n"}]`, "Retry them.\n\n---\n\nSigned", ""},
		{"insert after a section, before the next", `[{"type":"insert_after_section","heading":"Failures","content":"job_1042 was never picked up by a worker."}]`,
			"job_1041 timed out.\n\njob_1042 was never picked up by a worker.\n\n## Next steps", ""},
		{"insert after a heading written with its marks", `[{"type":"insert_after_section","heading":"## Next steps","content":"Then check the carrier's status page twice a day."}]`,
			"Retry them.\n\nThen check the carrier's status page", ""},
		{"normalize a heading, keeping the rest", `[{"type":"normalize_headings","headings":[{"lineNumber":3,"text":"## 1. Summary"}]}]`, "## 1. Summary\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWS(t)
			p, err := w.Propose("report.md", ops(t, tc.ops), "p")
			require.Nil(t, err)
			assert.Equal(t, workspace.StatusReady, p.Status, "%v", p.RiskFlags)
			f, err := w.Apply("p", p.BaseVersion)
			require.Nil(t, err)
			assert.Contains(t, f.Content, tc.want)
			if tc.wantNot != "" {
				assert.NotContains(t, f.Content, tc.wantNot)
			}
		})
	}
}

func TestBlockingRiskFlags(t *testing.T) {
	for _, tc := range []struct {
		name, ops string
		flag      string
	}{
		{"replace of text that is not there", `[{"type":"replace","find":"Four jobs","replace":"Five jobs and more words"}]`, workspace.FlagNotFound},
		{"insert after a heading that is not there", `[{"type":"insert_after_section","heading":"Causes","content":"A long cause analysis."}]`, workspace.FlagNotFound},
		{"normalize a line past the end", `[{"type":"normalize_headings","headings":[{"lineNumber":99,"text":"## X"}]}]`, workspace.FlagNotFound},
		{"normalize a line that is no heading", `[{"type":"normalize_headings","headings":[{"lineNumber":5,"text":"## Five"}]}]`, workspace.FlagNotFound},
		{"replace of text found twice", `[{"type":"replace","find":"job_1041","replace":"job 1041 of the north region"}]`, workspace.FlagAmbiguous},
		{"insert after a heading found twice", `[{"type":"append","content":"## Summary\n\nAgain, in other words."},{"type":"insert_after_section","heading":"Summary","content":"More."}]`, workspace.FlagAmbiguous},
		{"a replace that changes nothing", `[{"type":"replace","find":"Retry them.","replace":"Retry them."}]`, workspace.FlagNoGrowth},
		{"an append without words", `[{"type":"append","content":"  "}]`, workspace.FlagNoGrowth},
		{"a replace that drops a heading", `[{"type":"replace","find":"## Next steps\n\n","replace":"Next: "}]`, workspace.FlagStructureMaybeWorse},
		{"a normalize that duplicates a heading", `[{"type":"normalize_headings","headings":[{"lineNumber":7,"text":"## Summary"}]}]`, workspace.FlagStructureMaybeWorse},
		{"the whole document as replace content", `[{"type":"replace","content":"# A whole new report"}]`, workspace.FlagWholeDocumentReplace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWS(t)
			p, err := w.Propose("report.md", ops(t, tc.ops), "p")
			require.Nil(t, err)
			assert.Equal(t, workspace.StatusBlocked, p.Status)
			assert.Contains(t, p.RiskFlags, tc.flag)
			assert.NotEmpty(t, p.Suggestion)
			assert.True(t, w.Blocked())
			_, aerr := w.Apply("p", p.BaseVersion)
			require.NotNil(t, aerr, "a blocked preview never applies")
			assert.Equal(t, "preview_blocked", aerr.Details["reason"])
			assert.Equal(t, report, w.Files["report.md"].Content)
		})
	}
}

func TestApplyRefusals(t *testing.T) {
	grow := `[{"type":"append","content":"## Owners\n\nThe delivery team owns the retries."}]`
	t.Run("no pending patch", func(t *testing.T) {
		w := newWS(t)
		_, err := w.Apply("p", 0)
		assert.Equal(t, "no_pending_patch", err.Details["reason"])
	})
	t.Run("a patch id that is not the latest proposal", func(t *testing.T) {
		w := newWS(t)
		_, _ = w.Propose("report.md", ops(t, grow), "p1")
		_, _ = w.Propose("report.md", ops(t, grow), "p2")
		_, err := w.Apply("p1", 0)
		assert.Equal(t, "patch_id_mismatch", err.Details["reason"])
		assert.Equal(t, actionbus.CodePatchRejected, err.Code)
	})
	t.Run("a stale base version", func(t *testing.T) {
		w := newWS(t)
		p, _ := w.Propose("report.md", ops(t, grow), "p")
		_, err := w.Append("report.md", "A line appended meanwhile.", nil)
		require.Nil(t, err)
		_, aerr := w.Apply("p", p.BaseVersion)
		assert.Equal(t, "stale_base_version", aerr.Details["reason"])
		_, aerr = w.Apply("p", p.BaseVersion+7)
		assert.Equal(t, "stale_base_version", aerr.Details["reason"], "a base version the caller names wrong")
	})
	t.Run("a stale base version names each version for what it is", func(t *testing.T) {
		w := newWS(t)
		p, _ := w.Propose("report.md", ops(t, grow), "p")
		_, aerr := w.Apply("p", p.BaseVersion+7)
		require.NotNil(t, aerr)
		assert.Equal(t, p.BaseVersion+7, aerr.Details["baseVersion"], "the base version the caller gave")
		assert.Equal(t, p.BaseVersion, aerr.Details["previewVersion"])
		assert.Equal(t, p.BaseVersion, aerr.Details["currentVersion"])
		assert.Contains(t, aerr.Message, fmt.Sprintf("base version %d is not the version patch p was previewed on (%d)", p.BaseVersion+7, p.BaseVersion))

		_, err := w.Append("report.md", "A line appended meanwhile.", nil)
		require.Nil(t, err)
		_, aerr = w.Apply("p", 0)
		require.NotNil(t, aerr)
		assert.NotContains(t, aerr.Details, "baseVersion", "no base version was given")
		assert.Equal(t, p.BaseVersion, aerr.Details["previewVersion"])
		assert.Equal(t, p.BaseVersion+1, aerr.Details["currentVersion"])
		assert.Contains(t, aerr.Message, fmt.Sprintf("report.md is at version %d; patch p was previewed on version %d", p.BaseVersion+1, p.BaseVersion))
	})
	t.Run("a stored hash that no longer matches", func(t *testing.T) {
		w := newWS(t)
		_, _ = w.Propose("report.md", ops(t, grow), "p")
		w.Files["report.md"].Content += "\nchanged behind the version's back"
		_, err := w.Apply("p", 0)
		assert.Equal(t, "preview_hash_mismatch", err.Details["reason"])
	})
}

func TestApplyRecordsOneOperationAndClearsThePatch(t *testing.T) {
	w := newWS(t)
	p, _ := w.Propose("report.md", ops(t, `[{"type":"insert_after_section","heading":"Summary","content":"All three were retried twice before."}]`), "p")
	before := w.Files["report.md"].Stats
	ops := len(w.Operations)
	f, err := w.Apply("p", p.BaseVersion)
	require.Nil(t, err)
	assert.Equal(t, 2, f.Version)
	assert.Equal(t, 2, w.Version)
	assert.Nil(t, w.Pending)
	require.Len(t, w.Operations, ops+1)
	assert.Equal(t, workspace.Operation{Action: "apply_patch", Path: "report.md", Version: 2, PatchID: "p"}, w.Operations[ops])
	assert.Equal(t, before.Words+6, f.Stats.Words, "stats refreshed")
	_, err = w.Apply("p", 0)
	assert.Equal(t, "no_pending_patch", err.Details["reason"], "applied once")
}

func TestParseOpsTakesExactlyTheShapes(t *testing.T) {
	for _, raw := range []string{
		`[]`, `{}`, `[1]`,
		`[{"type":"diff","patch":"@@"}]`,
		`[{"type":"replace","find":"a"}]`,
		`[{"type":"replace","find":"a","replace":"b","content":"c"}]`,
		`[{"type":"append"}]`,
		`[{"type":"append","content":"x","heading":"h"}]`,
		`[{"type":"insert_after_section","content":"x"}]`,
		`[{"type":"normalize_headings","headings":[]}]`,
		`[{"type":"normalize_headings","headings":[{"lineNumber":"3","text":"# x"}]}]`,
		`[{"type":"replace","find":"a","replace":"b","replace_all":"yes"}]`,
	} {
		var v any
		require.NoError(t, json.Unmarshal([]byte(raw), &v))
		_, err := workspace.ParseOps(v)
		assert.NotNil(t, err, raw)
		if err != nil {
			assert.Equal(t, actionbus.CodeActionArgsInvalid, err.Code, raw)
		}
	}
}

func TestPathsAndBounds(t *testing.T) {
	w := newWS(t)
	for _, p := range []string{"", "/etc/passwd", "../x", "a/../../b", "a\\b"} {
		_, err := w.Append(p, "text", nil)
		require.NotNil(t, err, p)
		assert.Equal(t, actionbus.CodeWorkspacePath, err.Code)
	}
	_, err := w.Append("big.md", string(make([]byte, workspace.MaxFileBytes+1)), nil)
	require.NotNil(t, err)
	assert.Equal(t, "too_large", err.Details["reason"])
}

func FuzzPreview(f *testing.F) {
	f.Add(report, "Summary", "x", 3)
	f.Add("", "", "", 0)
	f.Fuzz(func(t *testing.T, content, heading, add string, line int) {
		after, flags := workspace.Preview(content, []workspace.Op{{Type: "insert_after_section", Heading: heading, Content: &add},
			{Type: "normalize_headings", Headings: []workspace.HeadingFix{{LineNumber: line, Text: "## " + heading}}}})
		if len(flags) == 0 && after == content {
			t.Fatal("an unchanged preview without no_growth")
		}
	})
}
