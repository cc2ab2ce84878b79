package run_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheCoreLinksNoNATS: the run core (internal/run) and the public wire
// model (events, catalog) link no NATS package, directly or through any
// of their dependencies; what talks to NATS is the shell (internal/bus
// and the store packages).
func TestTheCoreLinksNoNATS(t *testing.T) {
	for _, pkg := range []string{"github.com/actionbus/actionbus/internal/run", "github.com/actionbus/actionbus/events", "github.com/actionbus/actionbus/catalog"} {
		t.Run(pkg, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
			require.NoError(t, err, "%s", out)
			deps := strings.Fields(string(out))
			require.Contains(t, deps, pkg, "go list -deps lists the package itself")
			for _, dep := range deps {
				if strings.HasPrefix(dep, "github.com/nats-io/") {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		})
	}
}
