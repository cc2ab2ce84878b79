package cli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/internal/cli"
)

// TestHelpShowsNoSecretFromTheEnvironment: keys and passwords read from the
// environment are never flag defaults, so --help cannot print them.
func TestHelpShowsNoSecretFromTheEnvironment(t *testing.T) {
	const key = "k1:c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"
	t.Setenv("ACTIONBUS_APPROVAL_KEY", key)
	t.Setenv("NATS_URL", "nats://client:pw-very-secret@127.0.0.1:4222")
	for _, args := range [][]string{{"approve", "--help"}, {"deny", "--help"}, {"run", "--help"}, {"--help"}} {
		var out, errOut bytes.Buffer
		cli.Execute(context.Background(), args, nil, &out, &errOut)
		all := out.String() + errOut.String()
		assert.NotContains(t, all, "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", strings.Join(args, " "))
		assert.NotContains(t, all, "pw-very-secret", strings.Join(args, " "))
	}
	// A refused connection names the server without its password.
	t.Setenv("NATS_URL", "nats://client:pw-very-secret@127.0.0.1:1")
	var out, errOut bytes.Buffer
	code := cli.Execute(context.Background(), []string{"actions"}, nil, &out, &errOut)
	assert.NotEqual(t, 0, code)
	assert.NotContains(t, out.String()+errOut.String(), "pw-very-secret")
}

// TestExecReadsInputFromStdinAndFiles: --input - and --input @FILE, and a
// bad input is refused before anything is sent, without echoing it.
func TestExecInputIsRefusedWithoutEcho(t *testing.T) {
	var out, errOut bytes.Buffer
	code := cli.Execute(context.Background(), []string{"--nats", "nats://127.0.0.1:1", "exec", "x.y", "--input", "-"},
		strings.NewReader(`["Hunter2-not-an-object"]`), &out, &errOut)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut.String(), "--input (stdin): must be a JSON object, not an array")
	assert.NotContains(t, out.String()+errOut.String(), "Hunter2")
	out.Reset()
	errOut.Reset()
	code = cli.Execute(context.Background(), []string{"--nats", "nats://127.0.0.1:1", "exec", "x.y", "--input", "@/nonexistent/input.json"}, nil, &out, &errOut)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut.String(), "no such file")
}
