package dispatch

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/run"
)

// IDSecretKey is the key of the dispatchers' id secret in the runs bucket.
// Run ids never start with an underscore, so no run's state is stored
// under it; readers of the bucket that list runs skip it
// ([bus.RunStateKey]).
const IDSecretKey = "_dispatchers.idsecret"

// idSecretRefresh is how often a dispatcher rewrites the id secret, so
// that the bucket's TTL (the run retention, days) never expires it.
const idSecretRefresh = time.Hour

// idSecret is the secret every dispatcher derives runs' id keys from
// ([idSecret.key]). It is drawn once, by the first dispatcher, and kept in
// the runs bucket, which only the dispatcher user reads: a run admitted
// again (its request delivered again after a crash, or to the partition's
// next owner) gets the same id key, so the same ids, and its work items
// are deduplicated by their message ids — which is what lets an admission
// hand out its work while its state is written (see [Dispatcher.admit]).
type idSecret struct {
	kv     jetstream.KeyValue
	secret atomic.Pointer[[]byte]
}

func newIDSecret(kv jetstream.KeyValue, b []byte) *idSecret {
	s := &idSecret{kv: kv}
	s.secret.Store(&b)
	return s
}

// loadIDSecret reads the dispatchers' id secret from kv, drawing and
// storing it if there is none (create only: of two dispatchers starting
// at once, one stores its draw and both use it).
func loadIDSecret(ctx context.Context, kv jetstream.KeyValue) (*idSecret, error) {
	for attempt := 0; attempt < 3; attempt++ {
		gctx, cancel := bus.Bounded(ctx)
		entry, err := kv.Get(gctx, IDSecretKey)
		cancel()
		if err == nil {
			return parseIDSecret(kv, entry.Value())
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("dispatch: read the id secret: %w", err)
		}
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		cctx, cancel := bus.Bounded(ctx)
		_, err = kv.Create(cctx, IDSecretKey, []byte(hex.EncodeToString(b)))
		cancel()
		if err == nil {
			return newIDSecret(kv, b), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("dispatch: store the id secret: %w", err)
		}
	}
	return nil, errors.New("dispatch: the id secret was neither read nor stored")
}

func parseIDSecret(kv jetstream.KeyValue, v []byte) (*idSecret, error) {
	b, err := decodeIDSecret(v)
	if err != nil {
		return nil, err
	}
	return newIDSecret(kv, b), nil
}

func decodeIDSecret(v []byte) ([]byte, error) {
	b, err := hex.DecodeString(strings.TrimSpace(string(v)))
	if err != nil || len(b) < 16 {
		return nil, fmt.Errorf("dispatch: the stored id secret (%s) is not 16 or more hex bytes", IDSecretKey)
	}
	return b, nil
}

// key derives run runID's id key for tenant: HMAC-SHA256 of the tenant
// and the run id under the secret, 128 bits, hex (as [run.NewIDKey]
// draws them). Nobody without the secret can tell the ids it derives.
func (s *idSecret) key(tenant, runID string) string {
	m := hmac.New(sha256.New, *s.secret.Load())
	m.Write([]byte(tenant))
	m.Write([]byte{0})
	m.Write([]byte(runID))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// keepFresh rewrites the secret, unchanged, every idSecretRefresh until
// ctx ends, so that it never ages out of the bucket; a secret stored
// since (after one aged out while no dispatcher ran) is adopted, so that
// every dispatcher derives the same keys again. A rewrite that fails is
// tried at the next tick.
func (s *idSecret) keepFresh(ctx context.Context) {
	t := time.NewTicker(idSecretRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.refresh(ctx)
	}
}

// refresh rewrites the stored secret, or stores this one if none is
// stored, or adopts the one stored.
func (s *idSecret) refresh(ctx context.Context) {
	gctx, cancel := bus.Bounded(ctx)
	defer cancel()
	mine := []byte(hex.EncodeToString(*s.secret.Load()))
	entry, err := s.kv.Get(gctx, IDSecretKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		_, _ = s.kv.Create(gctx, IDSecretKey, mine)
	case err != nil:
	case hmac.Equal(mine, entry.Value()):
		_, _ = s.kv.Update(gctx, IDSecretKey, mine, entry.Revision())
	default:
		if b, derr := decodeIDSecret(entry.Value()); derr == nil {
			s.secret.Store(&b)
		}
	}
}

// idKey returns run runID's id key: derived from the dispatchers' secret,
// or drawn when the dispatcher has not read it (it always has once it
// serves).
func (d *Dispatcher) idKey(tenant, runID string) string {
	if d.ids == nil {
		return run.NewIDKey()
	}
	return d.ids.key(events.TenantOr(tenant), runID)
}

// earlyWorkWithin bounds how long ago a request may have been stored for
// its admission to hand work out before its state is written: well inside
// the streams' duplicate window (2 minutes by default), so that the work
// items of an admission that died before its state and of the one that
// admits the run again are deduplicated.
const earlyWorkWithin = 20 * time.Second

// firstFreshDelivery reports whether msg is delivered for the first time
// and was stored within earlyWorkWithin of now.
func firstFreshDelivery(msg jetstream.Msg, now time.Time) bool {
	if msg == nil {
		return false
	}
	md, err := msg.Metadata()
	if err != nil {
		return false
	}
	return md.NumDelivered == 1 && now.Sub(md.Timestamp) < earlyWorkWithin
}

// deduplicationCoversReadmission reports whether the streams an
// admission's work goes to (work items, decision and synthesis requests)
// deduplicate for at least twice the ack wait after which a request whose
// admission died is delivered again: only then is the work that admission
// handed out before its state deduplicated when the run is admitted
// again, and an admission may hand its work out early (see admit). The
// default window (2 minutes) does; a deployment that shortened it gets
// its work handed out after the state, as before.
func (d *Dispatcher) deduplicationCoversReadmission(ctx context.Context) (bool, error) {
	var need time.Duration
	for _, c := range d.topo.DispatcherConsumers(0) {
		if c.Stream != d.topo.StreamRequests() {
			continue
		}
		gctx, cancel := bus.Bounded(ctx)
		cons, err := d.js.Consumer(gctx, c.Stream, c.Config.Durable)
		cancel()
		if err != nil {
			return false, err
		}
		need = 2 * cons.CachedInfo().Config.AckWait
	}
	for _, name := range []string{d.topo.StreamWork(), d.topo.StreamRuns()} {
		gctx, cancel := bus.Bounded(ctx)
		stream, err := d.js.Stream(gctx, name)
		cancel()
		if err != nil {
			return false, err
		}
		if stream.CachedInfo().Config.Duplicates < need {
			d.log.Info("admissions hand their work out after their state: the stream's duplicate window is shorter than twice the ack wait",
				"stream", name, "duplicates", stream.CachedInfo().Config.Duplicates, "ack_wait", need/2)
			return false, nil
		}
	}
	return need > 0, nil
}
