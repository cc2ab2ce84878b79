package readapi

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
)

const run = "01M8VMH5H1YMS7K0VMCJPBQDRF"

func TestDecodeAcceptsOnlyTheDocumentedRequests(t *testing.T) {
	for _, tc := range []struct {
		op, body string
		want     actionbus.Code // "" accepts
	}{
		{OpEvents, `{"run":"` + run + `"}`, ""},
		{OpEvents, `{"run":"` + run + `","stream":"requests","verbs":["requested"],"last":true}`, ""},
		{OpEvents, `{"run":"` + run + `","verbs":["completed","failed","canceled"],"last":true,"headersOnly":true}`, ""},
		{OpEvents, `{"run":"` + run + `","after":12,"offset":300,"limit":1,"maxBytes":4096}`, ""},
		{OpEvents, ``, actionbus.CodeInvalidRunID},
		{OpEvents, `{"run":"01m8vmh5h1yms7k0vmcjpbqdrf"}`, actionbus.CodeInvalidRunID},
		{OpEvents, `{"run":"ab.run.globex.>"}`, actionbus.CodeInvalidRunID},
		{OpEvents, `{"run":"` + run + `","stream":"audit"}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","verbs":["requested"]}`, actionbus.CodeBadRequest}, // a requests verb on the runs stream
		{OpEvents, `{"run":"` + run + `","stream":"requests","verbs":["completed"]}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","verbs":["*"]}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","verbs":["step","step"]}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","verbs":["timer"]}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","last":true}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","verbs":["step"],"last":true,"after":3}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","since":"2026-01-01T00:00:00Z"}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","limit":1025}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","limit":-1}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","maxBytes":100}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","offset":-1}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `","filter":"ab.>"}`, actionbus.CodeBadRequest},
		{OpEvents, `{"run":"` + run + `"} {}`, actionbus.CodeBadRequest},
		{OpEvents, `[]`, actionbus.CodeBadRequest},
		{OpRuns, `{}`, ""},
		{OpRuns, `{"since":"2026-01-01T00:00:00Z"}`, ""},
		{OpRuns, `{"after":3,"since":"2026-01-01T00:00:00Z"}`, actionbus.CodeBadRequest},
		{OpRuns, `{"run":"` + run + `"}`, actionbus.CodeBadRequest},
		{OpRuns, `{"verbs":["step"]}`, actionbus.CodeBadRequest},
		{OpAudit, `{}`, ""},
		{OpAudit, `{"run":"` + run + `","after":9}`, ""},
		{OpAudit, `{"run":"x"}`, actionbus.CodeInvalidRunID},
		{OpAudit, `{"stream":"runs"}`, actionbus.CodeBadRequest},
		{OpArtifact, `{"id":"` + run + `"}`, ""},
		{OpArtifact, `{"id":"` + run + `","after":4}`, ""},
		{OpArtifact, `{"id":"*"}`, actionbus.CodeArtifactNotFound},
		{OpArtifact, `{"id":"` + run + `","run":"` + run + `"}`, actionbus.CodeBadRequest},
		{OpCatalog, `{"kind":"actions"}`, ""},
		{OpCatalog, `{"kind":"actions","from":"a.b"}`, ""},
		{OpCatalog, `{"kind":"skills","name":"writer"}`, ""},
		{OpCatalog, `{"kind":"skills","name":"*"}`, actionbus.CodeSkillNotFound},
		{OpCatalog, `{"kind":"skills","name":"a.b"}`, actionbus.CodeSkillNotFound},
		{OpCatalog, `{"kind":"actions","name":"x"}`, actionbus.CodeBadRequest},
		{OpCatalog, `{"kind":"buckets"}`, actionbus.CodeBadRequest},
		{OpCatalog, `{}`, actionbus.CodeBadRequest},
		{"stream.info", `{}`, actionbus.CodeBadRequest},
		{OpRuns, strings.Repeat(" ", MaxRequestBytes+1), actionbus.CodeBadRequest},
	} {
		t.Run(tc.op+" "+tc.body, func(t *testing.T) {
			_, err := Decode(tc.op, []byte(tc.body))
			assert.Equal(t, tc.want, actionbus.CodeOf(err), "%v", err)
		})
	}
}

func msgs(sizes ...int) []stored {
	out := make([]stored, len(sizes))
	for i, n := range sizes {
		out[i] = stored{seq: uint64(10 + i), subject: "ab.run.acme." + run + ".step", time: time.Unix(1, 0).UTC(),
			header: map[string][]string{"ce-id": {"x"}}, data: bytes.Repeat([]byte{'a' + byte(i)}, n), pending: uint64(len(sizes) - 1 - i)}
	}
	return out
}

func all(stored) bool { return true }

func TestFillBoundsAPage(t *testing.T) {
	for _, tc := range []struct {
		name          string
		msgs          []stored
		offset, limit int
		budget        int
		keep          func(stored) bool
		wantSeqs      []uint64
		wantNext      uint64
		wantMore      bool
		wantCut       bool
	}{
		{"everything fits", msgs(10, 10, 10), 0, 10, 10000, all, []uint64{10, 11, 12}, 12, false, false},
		{"the count bound", msgs(10, 10, 10), 0, 2, 10000, all, []uint64{10, 11}, 11, true, false},
		{"the byte bound", msgs(1000, 1000, 1000), 0, 10, 3300, all, []uint64{10, 11}, 11, true, false},
		{"a first message over the budget is cut", msgs(10000, 10), 0, 10, 4096, all, []uint64{10}, 9, true, true},
		{"a cut message continues from its offset", msgs(10000), 6000, 10, 8192, all, []uint64{10}, 10, false, false},
		{"skipped messages advance the cursor", msgs(10, 10, 10), 0, 10, 10000, func(s stored) bool { return s.seq != 12 },
			[]uint64{10, 11}, 12, false, false},
		{"nothing", nil, 0, 10, 10000, all, []uint64{}, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := fill(tc.msgs, tc.offset, tc.limit, tc.budget, false, tc.keep)
			require.NoError(t, err)
			seqs := []uint64{}
			for _, m := range p.Msgs {
				seqs = append(seqs, m.Seq)
			}
			assert.Equal(t, tc.wantSeqs, seqs)
			assert.Equal(t, tc.wantNext, p.Next)
			assert.Equal(t, tc.wantMore, p.More)
			if len(p.Msgs) > 0 {
				assert.Equal(t, tc.wantCut, p.Msgs[0].Cut())
			}
			b, err := json.Marshal(p)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(b), tc.budget, "the encoded page")
		})
	}
}

func TestACutMessageReassemblesExactly(t *testing.T) {
	m := msgs(50000)
	var got []byte
	offset := 0
	for pages := 0; ; pages++ {
		require.Less(t, pages, 100)
		p, err := fill(m, offset, 10, MinPageBytes, false, all)
		require.NoError(t, err)
		b, _ := json.Marshal(p)
		require.LessOrEqual(t, len(b), MinPageBytes)
		got = append(got, p.Msgs[0].Data...)
		if !p.Msgs[0].Cut() {
			break
		}
		offset = p.Msgs[0].Offset + len(p.Msgs[0].Data)
	}
	assert.Equal(t, m[0].data, got)
}

func TestHeadersOnlyPagesCarryNoData(t *testing.T) {
	p, err := fill(msgs(100000, 10), 0, 10, MinPageBytes, true, all)
	require.NoError(t, err)
	require.Len(t, p.Msgs, 2)
	for _, m := range p.Msgs {
		assert.Empty(t, m.Data)
		assert.False(t, m.Cut())
	}
}

func TestPageBudgetLeavesAMargin(t *testing.T) {
	assert.Equal(t, 1<<20-16<<10, PageBudget(1<<20))
	assert.Equal(t, 3072, PageBudget(4096))
}

func FuzzDecode(f *testing.F) {
	for _, seed := range []string{`{"run":"` + run + `"}`, `{"run":"` + run + `","verbs":["completed"],"last":true}`,
		`{"since":"2026-01-01T00:00:00Z"}`, `{"id":"` + run + `","after":3}`, `{"kind":"skills","name":"writer"}`, `{}`, ``, `{"run":1}`} {
		for _, op := range Ops {
			f.Add(op, []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, op string, body []byte) {
		r, err := Decode(op, body)
		if err != nil {
			if actionbus.CodeOf(err) == actionbus.CodeInternal {
				t.Fatalf("an untyped refusal: %v", err)
			}
			return
		}
		// What is accepted names no subject: run ids are ULIDs, verbs are
		// known verbs, skill names are tokens.
		for _, s := range append([]string{r.Run, r.ID, r.Name}, r.Verbs...) {
			if strings.ContainsAny(s, ".*> \t\r\n") {
				t.Fatalf("accepted %q in %+v", s, r)
			}
		}
		if r.Limit < 0 || r.Limit > MaxLimit || (r.MaxBytes != 0 && r.MaxBytes < MinPageBytes) || r.Offset < 0 {
			t.Fatalf("accepted bounds %+v", r)
		}
	})
}
