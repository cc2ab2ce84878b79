package cli_test

import (
	"os"
	"testing"
)

// TestMain keeps the tests off the user's configuration directory: `dev`
// creates the auditor's key there, and `audit verify` pins the public key
// it finds there.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "actionbus-cli-test-config-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	os.Unsetenv("ACTIONBUS_AUDITOR_KEY")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
