package dispatch

import (
	"sync"

	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/run"
)

// stateCacheEntries bounds the states kept decoded: runs beyond it are
// read from the bucket when their next event comes. Decoded states take
// about twice their stored size, and a dispatcher with 10 000 runs in
// flight stays under 100 MiB (make bench measures it).
const stateCacheEntries = 4096

// stateCache keeps the last stored state of active runs, decoded, with
// its revision, so a transition usually neither reads the bucket nor
// decodes. It is only an optimization: every write still carries the
// revision it read, so a stale entry fails the write and is reloaded.
// A transition takes its run's entry out ([stateCache.take]) and owns it
// until it puts the next state back: the run's lock keeps others out, and
// a transition that fails leaves nothing behind that it may have changed.
// Ended runs are evicted; when the cache is full an arbitrary entry is.
//
// It also remembers, for active and ended runs alike, the revision whose
// outbox this dispatcher published: a state read back at that revision
// has nothing left to send.
type stateCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]cachedState
	sent    map[string]uint64
}

type cachedState struct {
	st       *run.State
	revision uint64
	// fence is the partition fence under which this dispatcher wrote
	// revision; 0 when it read it (see Dispatcher.endFirst).
	fence uint64
}

func newStateCache(max int) *stateCache {
	return &stateCache{max: max, entries: make(map[string]cachedState), sent: make(map[string]uint64)}
}

// take removes runID's state from the cache and hands it to the caller.
func (c *stateCache) take(runID string) (cachedState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[runID]
	delete(c.entries, runID)
	return e, ok
}

// put caches st, stored at revision with its outbox published, by this
// dispatcher under fence (0: read, not written); the cache owns st from
// then on. Its outbox is not kept: it was sent.
func (c *stateCache) put(st *run.State, revision, fence uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	runID := st.RunID
	if _, ok := c.sent[runID]; !ok && len(c.sent) >= c.max {
		for k := range c.sent {
			delete(c.sent, k)
			break
		}
	}
	c.sent[runID] = revision
	if st.IsTerminal() {
		delete(c.entries, runID)
		return
	}
	if _, ok := c.entries[runID]; !ok && len(c.entries) >= c.max {
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	st.Outbox = nil
	c.entries[runID] = cachedState{st: st, revision: revision, fence: fence}
}

// forgetStates drops every cached state (not what was sent): a dispatcher
// that takes a partition may have cached its runs' states when it last
// owned it, and another owner has written them since.
func (c *stateCache) forgetStates() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
}

func (c *stateCache) drop(runID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, runID)
	delete(c.sent, runID)
}

// sentAt reports whether this dispatcher published the outbox of runID's
// state at revision.
func (c *stateCache) sentAt(runID string, revision uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.sent[runID]
	return ok && r == revision
}

// checkerCache keeps one compiled argument checker per catalog definition
// hash; a new definition version gets a new checker.
type checkerCache struct {
	mu sync.Mutex
	m  map[string]*actions.ArgsChecker
}

func newCheckerCache() *checkerCache { return &checkerCache{m: map[string]*actions.ArgsChecker{}} }

func (c *checkerCache) get(def actions.Definition, hash string) (*actions.ArgsChecker, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.m[hash]; ok {
		return ch, nil
	}
	ch, err := actions.NewArgsChecker(def)
	if err != nil {
		return nil, err
	}
	c.m[hash] = ch
	return ch, nil
}
