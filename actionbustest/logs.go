package actionbustest

import (
	"bytes"
	"sync"
)

// LogBuffer collects what several goroutines write — services' logs
// (slog.NewTextHandler(&buf, nil)), a process's output — for a test to
// read while they still write. The zero value is ready to use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
