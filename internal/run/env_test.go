package run

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/skills"
)

// memEnv is the world of the transition tests, in memory: a small
// catalog, the tier policy, one approval key, an artifact map and a clock
// the test moves.
type memEnv struct {
	mu        sync.Mutex
	catalog   map[string]*actions.Entry
	checkers  map[string]*actions.ArgsChecker
	policy    *policy.Evaluator
	keys      policy.Keys
	artifacts map[string][]byte
	now       time.Time
	// catalogDown makes catalog reads fail (the world cannot be asked).
	catalogDown bool
	// runs are other runs' stored states (for retries).
	runs map[string]*State
	// claimedFirst, when set, is a retry that claims a run between a
	// retry's read of it and its claim.
	claimedFirst string
	// tamper overwrites every artifact right after it is stored (another
	// writer of the store).
	tamper bool
	// limits are the limit states by key.
	limits map[string]*limits.State
	// skills are the catalog's skills by name.
	skills map[string]*skills.Skill
}

// addSkill puts a skill in the catalog, with its tools as hidden actions
// (as an executor's RegisterSkill does).
func (e *memEnv) addSkill(t testing.TB, s skills.Skill) {
	t.Helper()
	if s.Version == "" {
		s.Version = "1"
	}
	s.Pool = "default"
	require.NoError(t, s.Validate())
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.skills == nil {
		e.skills = map[string]*skills.Skill{}
	}
	e.skills[s.Name] = &s
	for _, tool := range s.Tools {
		params := tool.Parameters
		if params == nil {
			params = map[string]any{"type": "object"}
		}
		schema, err := json.Marshal(params)
		require.NoError(t, err)
		mode := actions.Mode(tool.Mode)
		if mode == "" {
			mode = actions.ModeRead
		}
		d := actions.Definition{Name: skills.ActionName(s.Name, tool.Name), Description: tool.Description, Mode: mode, Tier: tool.Tier,
			Pool: "default", Version: "1", InputSchema: schema, Planner: &actions.PlannerMeta{Hidden: true}}
		require.NoError(t, d.Normalize())
		e.catalog[d.Name] = &actions.Entry{Definition: d, Hash: d.Hash()}
	}
}

func (e *memEnv) Skill(_ context.Context, name string) (*skills.Skill, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.skills[name]; ok {
		c := *s
		return &c, nil
	}
	return nil, actionbus.Errorf(actionbus.CodeSkillNotFound, "skill %q is not in the catalog", name)
}

func (e *memEnv) Skills(_ context.Context) ([]skills.Skill, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []skills.Skill
	for _, s := range e.skills {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

var testKey = []byte("0123456789abcdef0123456789abcdef")

func newMemEnv(t testing.TB) *memEnv {
	e := &memEnv{catalog: map[string]*actions.Entry{}, checkers: map[string]*actions.ArgsChecker{}, policy: &policy.Evaluator{},
		keys: policy.Keys{"k1": {Secret: testKey, Holder: "ann"}, "gw": {Secret: testKey, Gateway: true}}, artifacts: map[string][]byte{}, runs: map[string]*State{}, now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	add := func(name string, mode actions.Mode, tier int, schema string) {
		d := actions.Definition{Name: name, Description: name, Mode: mode, Tier: tier, Pool: "default", Version: "1"}
		if schema == "" {
			schema = `{"type":"object"}`
		}
		d.InputSchema = json.RawMessage(schema)
		require.NoError(t, d.Normalize())
		e.catalog[name] = &actions.Entry{Definition: d, Hash: d.Hash()}
	}
	add("t.read", actions.ModeRead, 0, "")
	add("t.other", actions.ModeRead, 0, "")
	add("t.query", actions.ModeRead, 0, `{"type":"object","properties":{"q":{"type":"string"}},"required":["q"],"additionalProperties":false}`)
	add("t.draft", actions.ModeDraft, 0, "")
	add("t.mutate", actions.ModeMutate, 2, "")
	add("t.denied", actions.ModeRead, 3, "")
	return e
}

func (e *memEnv) Action(_ context.Context, name string) (*actions.Entry, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.catalogDown {
		return nil, fmt.Errorf("catalog unavailable")
	}
	if entry, ok := e.catalog[name]; ok {
		return entry, nil
	}
	return nil, fmt.Errorf("%w: %s", actionbus.ErrActionNotFound, name)
}

func (e *memEnv) Checker(entry *actions.Entry) (*actions.ArgsChecker, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.checkers[entry.Hash]; ok {
		return c, nil
	}
	c, err := actions.NewArgsChecker(entry.Definition)
	if err == nil {
		e.checkers[entry.Hash] = c
	}
	return c, err
}

func (e *memEnv) Evaluate(ctx context.Context, r policy.Request) policy.Snapshot {
	return e.policy.Evaluate(ctx, r)
}

func (e *memEnv) VerifyApproval(token string, c policy.ApprovalContext, claimed string, now time.Time) (string, error) {
	return e.keys.Verify(token, c, claimed, now)
}

func (e *memEnv) VerifyDenial(token, approvalID, reason, claimed string) (string, error) {
	return e.keys.VerifyDenial(token, approvalID, reason, claimed)
}

func (e *memEnv) VerifyPrincipal(token string, c policy.PrincipalClaim, now time.Time) (policy.Principal, error) {
	return e.keys.VerifyPrincipal(token, c, now)
}

func (e *memEnv) PutArtifact(_ context.Context, a *ArtifactWrite) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.artifacts[a.Ref.ID] = append([]byte(nil), a.Data...)
	if e.tamper {
		e.artifacts[a.Ref.ID] = []byte(`{"blob":"changed"}`)
	}
	return nil
}

func (e *memEnv) GetArtifact(_ context.Context, _ string, ref events.ArtifactRef) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	data, ok := e.artifacts[ref.ID]
	if !ok {
		return nil, fmt.Errorf("no artifact %s", ref.ID)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != ref.SHA256 {
		return nil, actionbus.Errorf(actionbus.CodeArtifactMismatch, "artifact %s does not match its digest", ref.ID)
	}
	return data, nil
}

func (e *memEnv) PriorRun(_ context.Context, tenant, runID string) (*State, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.runs[runID]
	if !ok || st.TenantOrDefault() != tenant {
		return nil, nil
	}
	b, err := json.Marshal(st) // a copy, as read from the bucket
	if err != nil {
		return nil, err
	}
	var cp State
	return &cp, json.Unmarshal(b, &cp)
}

func (e *memEnv) ClaimRetry(_ context.Context, priorID, retryID string) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.runs[priorID]
	if !ok {
		return "", fmt.Errorf("no run %s", priorID)
	}
	if e.claimedFirst != "" {
		// Another retry wrote its claim after this one's read.
		st.RetriedBy, e.claimedFirst = e.claimedFirst, ""
	}
	if st.RetriedBy == "" {
		st.RetriedBy = retryID
	}
	return st.RetriedBy, nil
}

func (e *memEnv) Now() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func (e *memEnv) advance(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = e.now.Add(d)
}

// sign returns a valid approval token for a pending approval.
func sign(t testing.TB, c events.ApprovalContext) string {
	tok, err := policy.Sign("k1", testKey, policy.ApprovalContext(c))
	require.NoError(t, err)
	return tok
}

// signDenial is ann's denial of an approval, with key k1.
func signDenial(t testing.TB, approvalID, reason string) string {
	tok, err := policy.SignDenial("k1", testKey, approvalID, reason)
	require.NoError(t, err)
	return tok
}

// Acquire keeps limits in memory, with the rules of package limits.
func (e *memEnv) Acquire(_ context.Context, st *State, c CallState) (Capacity, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	entry, ok := e.catalog[c.Action]
	if !ok {
		return Capacity{OK: true}, nil
	}
	spec := e.policy.Config.LimitFor(c.Action, entry.Limits)
	if spec.IsZero() {
		return Capacity{OK: true}, nil
	}
	key, err := spec.RenderKey(LimitCall(st, c))
	if err != nil {
		return Capacity{}, err
	}
	if e.limits == nil {
		e.limits = map[string]*limits.State{}
	}
	ls := e.limits[key]
	if ls == nil {
		ls = &limits.State{Key: key}
		e.limits[key] = ls
	}
	g := limits.Acquire(ls, spec, LimitRequest(st, c, time.Minute), e.now)
	return Capacity{Key: key, OK: g.OK, RetryAt: g.RetryAt, Position: g.Position, Waiting: g.Waiting}, nil
}

// release frees a slot as the dispatcher does for a release effect.
func (e *memEnv) release(key, callID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ls := e.limits[key]; ls != nil {
		limits.Release(ls, callID)
	}
}
