package conformance_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/conformance"
	"github.com/actionbus/actionbus/internal/registrar"
)

// serve runs the registrar and a Go executor hosting the conformance
// catalog on srv until the test ends.
func serve(t *testing.T, srv *actionbustest.Server, cfg executor.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	regDone := make(chan error, 1)
	go func() { regDone <- registrar.Run(ctx, srv.Conn, "", nil) }()
	ex, err := executor.New(srv.Connect(t), cfg)
	require.NoError(t, err)
	require.NoError(t, conformance.RegisterCatalog(ex))
	exDone := make(chan error, 1)
	go func() { exDone <- ex.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-exDone)
		assert.NoError(t, <-regDone)
	})
	select {
	case <-ex.Ready():
	case err := <-exDone:
		t.Fatalf("executor stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("executor not ready")
	}
}

// The Go executor passes every case of the kit, in well under a minute.
func TestTheGoExecutorPassesTheKit(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	serve(t, srv, executor.Config{Slots: 3})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	rows, err := conformance.RunExecutor(ctx, srv.Conn, conformance.Config{})
	require.NoError(t, err)
	var table strings.Builder
	conformance.PrintTable(&table, rows)
	t.Logf("took %s\n%s", time.Since(start), table.String())
	assert.Zero(t, conformance.Failed(rows), table.String())
	assert.Less(t, time.Since(start), 30*time.Second)
}
