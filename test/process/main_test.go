package process

import (
	"os"
	"testing"
)

// TestMain keeps the binaries off the user's configuration directory: an
// auditor without --key-file creates its signing key there.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "actionbus-process-test-config-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
