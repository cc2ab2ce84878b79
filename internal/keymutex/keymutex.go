// Package keymutex serializes work per key (a run id) inside one process
// with a fixed set of striped locks, so memory does not grow with the number
// of keys. It complements, and never replaces, revision checks in
// JetStream, which serialize across processes.
package keymutex

import "hash/maphash"

// Striped is a fixed set of mutexes chosen by key hash. The zero value is
// not usable; use New.
type Striped struct {
	seed  maphash.Seed
	locks []chan struct{}
}

// New returns n stripes (n < 1 means 64).
func New(n int) *Striped {
	if n < 1 {
		n = 64
	}
	s := &Striped{seed: maphash.MakeSeed(), locks: make([]chan struct{}, n)}
	for i := range s.locks {
		s.locks[i] = make(chan struct{}, 1)
	}
	return s
}

// Lock locks the stripe of key and returns its unlock function.
func (s *Striped) Lock(key string) (unlock func()) {
	l := s.locks[maphash.String(s.seed, key)%uint64(len(s.locks))]
	l <- struct{}{}
	return func() { <-l }
}
