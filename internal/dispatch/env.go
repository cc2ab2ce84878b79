package dispatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/skills"
)

// env is the world as the run state machine sees it from the dispatcher:
// the catalog view, the policy in force, the approval keys, the artifact
// store and the clock.
type env struct{ d *Dispatcher }

func (e env) Action(ctx context.Context, name string) (*actions.Entry, error) {
	return e.d.cat.Get(ctx, name)
}

func (e env) Skill(ctx context.Context, name string) (*skills.Skill, error) {
	return skills.Get(ctx, e.d.catKV, name)
}

func (e env) Skills(ctx context.Context) ([]skills.Skill, error) {
	return skills.List(ctx, e.d.catKV)
}

func (e env) Checker(entry *actions.Entry) (*actions.ArgsChecker, error) {
	return e.d.checkers.get(entry.Definition, entry.Hash)
}

func (e env) Evaluate(ctx context.Context, r policy.Request) policy.Snapshot {
	return e.d.policy.Load().Evaluate(ctx, r)
}

func (e env) VerifyApproval(token string, c policy.ApprovalContext, claimed string, now time.Time) (string, error) {
	return e.d.cfg.ApprovalKeys.Verify(token, c, claimed, now)
}

func (e env) VerifyDenial(token, approvalID, reason, claimed string) (string, error) {
	return e.d.cfg.ApprovalKeys.VerifyDenial(token, approvalID, reason, claimed)
}

func (e env) VerifyPrincipal(token string, c policy.PrincipalClaim, now time.Time) (policy.Principal, error) {
	return e.d.cfg.ApprovalKeys.VerifyPrincipal(token, c, now)
}

func (e env) PutArtifact(ctx context.Context, tenant, id string, data []byte) (events.ArtifactRef, error) {
	sum := sha256.Sum256(data)
	ref := events.ArtifactRef{ID: id, Role: "output", MediaType: "application/json", Bytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	cctx, cancel := events.Bounded(ctx)
	defer cancel()
	meta := jetstream.ObjectMeta{Name: id, Description: "output", Headers: nats.Header{"Content-Type": []string{ref.MediaType},
		events.ArtifactTenantHeader: []string{events.TenantOr(tenant)}}}
	if _, err := e.d.artifacts.Put(cctx, meta, bytes.NewReader(data)); err != nil {
		return events.ArtifactRef{}, err
	}
	return ref, nil
}

func (e env) GetArtifact(ctx context.Context, ref events.ArtifactRef) ([]byte, error) {
	cctx, cancel := events.Bounded(ctx)
	defer cancel()
	data, err := e.d.artifacts.GetBytes(cctx, ref.ID)
	if err != nil {
		return nil, err
	}
	if ref.SHA256 != "" {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != ref.SHA256 {
			return nil, actionbus.Errorf(actionbus.CodeArtifactMismatch, "artifact %s does not match its digest", ref.ID).WithDetail("artifact", ref.ID)
		}
	}
	return data, nil
}

func (e env) PriorRun(ctx context.Context, runID string) (*run.State, error) {
	st, _, err := e.d.loadStored(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	return st, err
}

func (env) Now() time.Time { return time.Now() }
