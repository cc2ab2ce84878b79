package audit_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
)

func seed(t *testing.T) ([]byte, string) {
	t.Helper()
	s, err := audit.NewKey()
	require.NoError(t, err)
	kp, err := nkeys.FromSeed(s)
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	return s, pub
}

func unsealed(from, n int) []events.AuditRecorded {
	var out []events.AuditRecorded
	for i := from; i < from+n; i++ {
		out = append(out, events.AuditRecorded{RunID: "R", EventID: string(rune('a' + i)), EventType: events.TypeRunStep, Kind: "step",
			EventTime: time.Unix(int64(i), 0).UTC(), PayloadHash: "00", Source: &events.AuditSource{Stream: "AB_RUNS", Seq: uint64(10 + i)}})
	}
	return out
}

// signedChain is appends of the given sizes, each sealed with seed after
// the chain before it (which starts after prefix).
func signedChain(seed []byte, prefix []events.AuditRecorded, sizes ...int) []events.AuditRecorded {
	out := append([]events.AuditRecorded(nil), prefix...)
	for _, size := range sizes {
		prev, n := "", uint64(0)
		if len(out) > 0 {
			prev, n = out[len(out)-1].Hash, out[len(out)-1].N
		}
		out = append(out, audit.SealForTest(seed, prev, n, unsealed(len(out), size))...)
	}
	return out
}

// rechain recomputes the numbers, links and hashes of recs from i on, and
// signs each append's last record with seed, as someone who rewrites a
// sink without the auditor's key would (with a key of their own).
func rechain(t *testing.T, recs []events.AuditRecorded, from int, seed []byte) []events.AuditRecorded {
	t.Helper()
	out := append([]events.AuditRecorded(nil), recs...)
	kp, err := nkeys.FromSeed(seed)
	require.NoError(t, err)
	pub, _ := kp.PublicKey()
	for i := from; i < len(out); i++ {
		prev, n := "", uint64(0)
		if i > 0 {
			prev, n = out[i-1].Hash, out[i-1].N
		}
		out[i].PrevHash, out[i].N = prev, n+1
		if out[i].Sig != "" {
			out[i].Signer = pub
		}
		out[i].Hash = audit.ChainHash(out[i])
		if out[i].Sig != "" {
			out[i].Sig = sigOf(t, kp, out[i].Hash)
		}
	}
	return out
}

func sigOf(t *testing.T, kp nkeys.KeyPair, hash string) string {
	t.Helper()
	sig, err := kp.Sign([]byte("actionbus.audit.v2:" + hash))
	require.NoError(t, err)
	return audit.B64(sig)
}

func TestCheck(t *testing.T) {
	auditor, pub := seed(t)
	other, otherPub := seed(t)
	signed := signedChain(auditor, nil, 3, 1, 2) // records 1-3, 4, 5-6
	dropped := append(append([]events.AuditRecorded(nil), signed[:1]...), signed[3:]...)
	cases := []struct {
		name   string
		chain  []events.AuditRecorded
		keys   []string
		broken string // finding kind, "" when it verifies
		at     int    // 0-based index of the finding
		format string
	}{
		{name: "format 1 chain", chain: chain(4), keys: []string{pub}, format: "format 1, unsigned"},
		{name: "signed chain, pinned", chain: signed, keys: []string{pub}, format: "format 2, signed by " + pub},
		{name: "signed chain, rotated keys", chain: signed, keys: []string{otherPub, pub}, format: "format 2, signed by " + pub},
		{name: "signed chain, not pinned", chain: signed, format: "format 2, signed by " + pub + " (key not pinned"},
		{name: "format 1 then format 2", chain: signedChain(auditor, chain(2), 2), keys: []string{pub}, format: "format 1, unsigned (records 1-2), then format 2"},
		{name: "signed by another key", chain: signed, keys: []string{otherPub}, broken: audit.BreakSignature, at: 2},
		{name: "two records dropped", chain: dropped, keys: []string{pub}, broken: audit.BreakGap, at: 1},
		{name: "two records dropped, rechained and re-signed", chain: rechain(t, dropped, 1, other), keys: []string{pub}, broken: audit.BreakSignature, at: 1},
		{name: "rechained, re-signed, key not pinned: the signer is the rewriter's", chain: rechain(t, dropped, 1, other), format: "signed by " + otherPub + " (key not pinned"},
		{name: "an altered record", chain: alter(signed, 4), keys: []string{pub}, broken: audit.BreakLink, at: 4},
		{name: "signatures stripped", chain: stripSigs(rechain(t, dropped, 1, other)), keys: []string{pub}, broken: audit.BreakUnsigned, at: 3},
		{name: "rewritten as format 1", chain: append(signed[:2:2], chain(1)...), keys: []string{pub}, broken: audit.BreakDowngrade, at: 2},
		{name: "records reordered", chain: []events.AuditRecorded{signed[0], signed[2], signed[1]}, keys: []string{pub}, broken: audit.BreakGap, at: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := audit.Check(c.chain, c.keys...)
			if c.broken == "" {
				require.Nil(t, v.Broken, "%+v", v.Broken)
				assert.Contains(t, v.Format(), c.format)
				return
			}
			require.NotNil(t, v.Broken)
			assert.Equal(t, c.broken, v.Broken.Kind, v.Broken.Message)
			assert.Equal(t, c.at, v.Broken.At, v.Broken.Message)
		})
	}
}

func alter(recs []events.AuditRecorded, i int) []events.AuditRecorded {
	out := append([]events.AuditRecorded(nil), recs...)
	out[i].Summary = "altered"
	return out
}

func stripSigs(recs []events.AuditRecorded) []events.AuditRecorded {
	out := append([]events.AuditRecorded(nil), recs...)
	for i := 1; i < len(out); i++ {
		out[i].Sig, out[i].Signer = "", ""
		out[i].PrevHash = out[i-1].Hash
		out[i].Hash = audit.ChainHash(out[i])
	}
	return out
}

func TestMarkDuplicates(t *testing.T) {
	call := "01JCALL0000000000000000000"
	res := func(id string, attempt int) events.AuditRecorded {
		return events.AuditRecorded{Kind: audit.KindAction, EventType: events.TypeActionCompleted, Status: "succeeded", ExecutionID: call, Attempt: attempt, EventID: id}
	}
	genuine := events.ResultID(call, 1)
	cases := []struct {
		name   string
		known  map[string]string
		recs   []events.AuditRecorded
		status []string // status and duplicate kind per record
	}{
		{name: "first result is the outcome", recs: []events.AuditRecorded{res(genuine, 1)}, status: []string{"succeeded/"}},
		{name: "a second answer in the same append", recs: []events.AuditRecorded{res(genuine, 1), res(genuine, 1)}, status: []string{"succeeded/", "duplicate/redispatch"}},
		{name: "an answer after the outcome was stored", known: map[string]string{call + "/1": genuine}, recs: []events.AuditRecorded{res(genuine, 1)}, status: []string{"duplicate/redispatch"}},
		{name: "two forged copies", recs: []events.AuditRecorded{res(genuine, 1), res("FORGED1", 1), res("FORGED2", 1)}, status: []string{"succeeded/", "duplicate/forgery", "duplicate/forgery"}},
		{name: "another attempt has its own outcome", known: map[string]string{call + "/1": genuine}, recs: []events.AuditRecorded{res(events.ResultID(call, 2), 2)}, status: []string{"succeeded/"}},
		{name: "a request is no outcome", recs: []events.AuditRecorded{{Kind: audit.KindAction, EventType: events.TypeActionRequested, Status: "started", ExecutionID: call, Attempt: 1}, res(genuine, 1)}, status: []string{"started/", "succeeded/"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := audit.MarkDuplicates(c.known, c.recs)
			var got []string
			for _, r := range out {
				got = append(got, r.Status+"/"+r.Duplicate)
				if r.Status == audit.StatusDuplicate {
					assert.Equal(t, genuine, r.DuplicateOf)
				}
			}
			assert.Equal(t, c.status, got)
		})
	}
}

// Check reads sink files anyone may have written: whatever the records
// hold, it answers without panicking, and a chain it accepts links up.
func FuzzCheck(f *testing.F) {
	s, _ := audit.NewKey()
	good := signedChain(s, chain(2), 2, 1)
	for _, r := range good {
		b, _ := json.Marshal(r)
		f.Add(b, uint8(1))
	}
	f.Add([]byte(`{"v":2,"n":1,"sig":"!!","signer":"Ax"}`), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, at uint8) {
		var r events.AuditRecorded
		if json.Unmarshal(data, &r) != nil {
			return
		}
		recs := append([]events.AuditRecorded(nil), good...)
		recs[int(at)%len(recs)] = r
		v := audit.Check(recs)
		if v.Broken == nil {
			assert.Equal(t, -1, audit.Verify(recs))
		}
		_, _ = audit.ParsePublicKey(string(data))
	})
}

func TestLoadOrCreateKeyKeepsTheKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "auditor.nk")
	seed, created, err := audit.LoadOrCreateKey(path)
	require.NoError(t, err)
	assert.True(t, created)
	again, created, err := audit.LoadOrCreateKey(path)
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, seed, again)
	kp, err := nkeys.FromSeed(seed)
	require.NoError(t, err)
	pub, _ := kp.PublicKey()
	b, err := os.ReadFile(path + ".pub")
	require.NoError(t, err)
	got, err := audit.ParsePublicKey(string(b))
	require.NoError(t, err)
	assert.Equal(t, pub, got)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	require.NoError(t, os.WriteFile(path, []byte("SUnotaseed"), 0o600))
	_, _, err = audit.LoadOrCreateKey(path)
	assert.Error(t, err)
}

func TestSourceGaps(t *testing.T) {
	rec := func(stream string, seq uint64) events.AuditRecorded {
		return events.AuditRecorded{Source: &events.AuditSource{Stream: stream, Seq: seq}}
	}
	st := func(stream string, seq uint64) audit.Stored { return audit.Stored{Stream: stream, Seq: seq, Type: "t"} }
	cases := []struct {
		name    string
		records []events.AuditRecorded
		stored  []audit.Stored
		gaps    []uint64 // sequences
		before  []int
	}{
		{name: "every event recorded", records: []events.AuditRecorded{rec("R", 3), rec("Q", 1), rec("R", 7)},
			stored: []audit.Stored{st("R", 3), st("R", 7), st("Q", 1)}},
		{name: "an event between two recorded ones", records: []events.AuditRecorded{rec("R", 3), rec("R", 9)},
			stored: []audit.Stored{st("R", 3), st("R", 5), st("R", 9)}, gaps: []uint64{5}, before: []int{1}},
		{name: "events before and after the span are not judged", records: []events.AuditRecorded{rec("R", 3), rec("R", 9)},
			stored: []audit.Stored{st("R", 1), st("R", 3), st("R", 9), st("R", 12)}},
		{name: "a stream the chain does not name", records: []events.AuditRecorded{rec("R", 3)}, stored: []audit.Stored{st("Q", 2)}},
		{name: "format-1 records name nothing", records: []events.AuditRecorded{{}, {}}, stored: []audit.Stored{st("R", 2)}},
		{name: "gaps in two streams", records: []events.AuditRecorded{rec("R", 3), rec("Q", 1), rec("R", 6), rec("Q", 4)},
			stored: []audit.Stored{st("R", 3), st("R", 4), st("R", 6), st("Q", 1), st("Q", 2), st("Q", 4)}, gaps: []uint64{4, 2}, before: []int{2, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gaps := audit.SourceGaps(c.records, c.stored)
			var seqs []uint64
			var before []int
			for _, g := range gaps {
				seqs, before = append(seqs, g.Seq), append(before, g.Before)
			}
			assert.Equal(t, c.gaps, seqs)
			assert.Equal(t, c.before, before)
		})
	}
}

// BenchmarkSeal is one append of eight records: numbering, hashing and
// one signature (plus decoding the seed, which the auditor does once).
func BenchmarkSeal(b *testing.B) {
	s, _ := audit.NewKey()
	recs := unsealed(0, 8)
	for b.Loop() {
		audit.SealForTest(s, "", 0, recs)
	}
}

// BenchmarkHashOnly is the same append's hashing alone, as format 1 did.
func BenchmarkHashOnly(b *testing.B) {
	recs := unsealed(0, 8)
	for b.Loop() {
		prev := ""
		for i := range recs {
			r := recs[i]
			r.PrevHash = prev
			prev = audit.ChainHash(r)
		}
	}
}

// BenchmarkSign is the one signature of an append.
func BenchmarkSign(b *testing.B) {
	s, _ := audit.NewKey()
	kp, _ := nkeys.FromSeed(s)
	msg := []byte("actionbus.audit.v2:" + strings.Repeat("ab", 32))
	for b.Loop() {
		_, _ = kp.Sign(msg)
	}
}

// TestTheAuditorSignsAsItsNkeyDoes: the auditor signs with the Ed25519 key
// it derives once from its seed; every signature is the one nkeys' own
// Sign makes, and verifies against the auditor's public key.
func TestTheAuditorSignsAsItsNkeyDoes(t *testing.T) {
	for i := range 8 {
		seed, err := audit.NewKey()
		require.NoError(t, err)
		kp, err := nkeys.FromSeed(seed)
		require.NoError(t, err)
		rec := events.AuditRecorded{Hash: strings.Repeat(strconv.Itoa(i), 64)}
		audit.SignForTest(seed, &rec)
		want, err := kp.Sign([]byte("actionbus.audit.v2:" + rec.Hash))
		require.NoError(t, err)
		assert.Equal(t, audit.B64(want), rec.Sig)
		sig, err := base64.RawURLEncoding.DecodeString(rec.Sig)
		require.NoError(t, err)
		require.NoError(t, kp.Verify([]byte("actionbus.audit.v2:"+rec.Hash), sig))
	}
}
