package cli_test

import (
	"bytes"
	"regexp"
	"sync"
	"testing"
	"time"
)

type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
	// changed is signaled on every write.
	changed chan struct{}
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.changed == nil {
		w.changed = make(chan struct{}, 1)
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func (w *syncWriter) signal() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.changed == nil {
		w.changed = make(chan struct{}, 1)
	}
	return w.changed
}

var (
	urlPattern   = regexp.MustCompile(`at (nats://127\.0\.0\.1:\d+)`)
	credsPattern = regexp.MustCompile(`tenant default: client creds (\S+),`)
)

// waitForURL waits until dev prints its server URL. In operator mode (dev
// prints its URL and the CLI's creds at once) it sets NATS_CREDS for the
// test, so that the commands run against dev connect as dev says.
func waitForURL(t *testing.T, w *syncWriter) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if m := urlPattern.FindStringSubmatch(w.String()); m != nil {
			if c := credsPattern.FindStringSubmatch(w.String()); c != nil {
				t.Setenv("NATS_CREDS", c[1])
			}
			return m[1]
		}
		select {
		case <-w.signal():
		case <-deadline:
			t.Fatalf("dev printed no URL:\n%s", w.String())
		}
	}
}
