// Package artifacts stores and reads large outputs in the deployment's
// object stores: each pool's executors write their pool's store
// (bus.Topology.PoolArtifacts), the dispatcher writes the services'
// store (bus.Topology.BucketArtifacts). Every object records the tenant
// and the run it belongs to, and a reference names the store that holds
// it (events.ArtifactRef.Store).
//
// [Read] is the one way to read an artifact as a tenant: it refuses a
// store that is not an artifact store and an object recorded for another
// tenant with the same artifact_not_found a missing object gets.
package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// Metadata keys of every artifact object.
const (
	MetaTenant = "tenant"
	MetaRun    = "run"
)

// Owner is whom an artifact belongs to.
type Owner struct {
	Tenant string
	RunID  string
}

// Store is an object store and its name (what references record).
type Store struct {
	Name string
	OS   jetstream.ObjectStore
}

// Open binds the object store named name.
func Open(ctx context.Context, js jetstream.JetStream, name string) (Store, error) {
	os, err := js.ObjectStore(ctx, name)
	if err != nil {
		return Store{}, err
	}
	return Store{Name: name, OS: os}, nil
}

// Put stores data in store under id, recording owner, and returns its
// reference: id, role, media type, size, SHA-256, the store's name, and a
// preview of at most previewBytes (cut at a UTF-8 boundary; Truncated when
// it is not all of data; previewBytes <= 0 stores no preview). Storing the same id again replaces the object.
func Put(ctx context.Context, store Store, owner Owner, id, role, mediaType string, data []byte, previewBytes int) (events.ArtifactRef, error) {
	meta := jetstream.ObjectMeta{Name: id, Description: role, Headers: nats.Header{"Content-Type": []string{mediaType}},
		Metadata: map[string]string{MetaTenant: events.TenantOr(owner.Tenant), MetaRun: owner.RunID}}
	if _, err := store.OS.Put(ctx, meta, bytes.NewReader(data)); err != nil {
		return events.ArtifactRef{}, err
	}
	return events.NewArtifactRef(store.Name, id, role, mediaType, data, previewBytes), nil
}

// Artifact is an artifact read back.
type Artifact struct {
	Data      []byte
	MediaType string
	// RunID is the run the artifact was recorded for.
	RunID string
}

// notFound is the one answer for a missing artifact, one in a store that
// is no artifact store, and another tenant's.
func notFound(ref events.ArtifactRef) error {
	return actionbus.Errorf(actionbus.CodeArtifactNotFound, "artifact %q is not found", clip(ref.ID)).WithDetail("artifact", clip(ref.ID))
}

// Owned decides whether an object whose metadata is meta may be read by
// tenant: only when it records that very tenant ("" is the default
// tenant). An object that records no tenant (stored before objects did)
// belongs to nobody.
func Owned(meta map[string]string, tenant string) bool {
	t, ok := meta[MetaTenant]
	return ok && t != "" && t == events.TenantOr(tenant)
}

// Read returns the artifact ref names, read as tenant: the store must be
// one of topo's artifact stores (ref.Store; "" is the services' store),
// the object must exist and record tenant as its owner, and its bytes must
// match ref.SHA256 when the reference has one. Anything else is
// artifact_not_found (one answer, so a tenant learns nothing of other
// tenants' artifacts), or artifact_mismatch for bytes that changed.
func Read(ctx context.Context, js jetstream.JetStream, topo bus.Topology, tenant string, ref events.ArtifactRef) (*Artifact, error) {
	name := ref.Store
	if name == "" {
		name = topo.BucketArtifacts()
	}
	if !topo.ArtifactStore(name) || ref.ID == "" {
		return nil, notFound(ref)
	}
	store, err := js.ObjectStore(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, notFound(ref)
	}
	if err != nil {
		return nil, fmt.Errorf("artifacts: store %s: %w", name, err)
	}
	info, err := store.GetInfo(ctx, ref.ID)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, notFound(ref)
	}
	if err != nil {
		return nil, fmt.Errorf("artifacts: %s: %w", ref.ID, err)
	}
	if !Owned(info.Metadata, tenant) {
		return nil, notFound(ref)
	}
	data, err := store.GetBytes(ctx, ref.ID)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, notFound(ref)
	}
	if err != nil {
		return nil, fmt.Errorf("artifacts: %s: %w", ref.ID, err)
	}
	if ref.SHA256 != "" {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != ref.SHA256 {
			return nil, actionbus.Errorf(actionbus.CodeArtifactMismatch, "artifact %s does not match its digest", clip(ref.ID)).WithDetail("artifact", clip(ref.ID))
		}
	}
	a := &Artifact{Data: data, RunID: info.Metadata[MetaRun]}
	if info.Headers != nil {
		a.MediaType = info.Headers.Get("Content-Type")
	}
	return a, nil
}

// ReadByID returns the artifact id names, read as tenant, for a caller
// that has the id but not the reference (`actionbus artifacts get ID`): it
// looks in the services' store and in every pool's artifact store, and
// reads the one object of that id recorded for tenant. An id that two
// stores hold for tenant is refused (artifact_not_found): a pool cannot
// shadow another pool's artifact by planting one under its id. Prefer
// [Read] with the reference.
func ReadByID(ctx context.Context, js jetstream.JetStream, topo bus.Topology, tenant, id string) (*Artifact, error) {
	ref := events.ArtifactRef{ID: id}
	if id == "" {
		return nil, notFound(ref)
	}
	names := js.StreamNames(ctx, jetstream.WithStreamListSubject("$O.*.M.>"))
	var found []string
	for stream := range names.Name() {
		store, ok := strings.CutPrefix(stream, "OBJ_")
		if !ok || !topo.ArtifactStore(store) {
			continue
		}
		os, err := js.ObjectStore(ctx, store)
		if err != nil {
			continue
		}
		if info, err := os.GetInfo(ctx, id); err == nil && Owned(info.Metadata, tenant) {
			found = append(found, store)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("artifacts: list the stores: %w", err)
	}
	if len(found) != 1 {
		return nil, notFound(ref)
	}
	ref.Store = found[0]
	return Read(ctx, js, topo, tenant, ref)
}

func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}
