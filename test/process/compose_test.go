package process

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/loader"
	composeschema "github.com/compose-spec/compose-go/v2/schema"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTheComposeFileIsValidAndRunsWhatExists keeps docker-compose.yml
// true without a Docker engine: it is loaded the way `docker compose
// config` loads it (compose-go: anchors merged, ${VAR:-default}
// interpolated) and validated against the Compose Specification's JSON
// Schema; every command a service runs is a binary of this repository
// whose --help names each flag and each ACTIONBUS_/NATS_ variable the
// service sets; every file a bind mount or a nats-server -c names exists;
// and every NATS user a service connects as is a user of
// deploy/nats/accounts.conf.
func TestTheComposeFileIsValidAndRunsWhatExists(t *testing.T) {
	root := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithName("actionbus"), cli.WithEnv([]string{}))
	require.NoError(t, err)
	model, err := opts.LoadModel(ctx)
	require.NoError(t, err, "docker-compose.yml does not load")
	require.NoError(t, composeschema.Validate(model), "docker-compose.yml against the Compose Specification's schema")
	project, err := opts.LoadProject(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, project.Services)

	bins := buildCommands(t, root)
	accounts, err := os.ReadFile(filepath.Join(root, "deploy/nats/accounts.conf"))
	require.NoError(t, err)
	natsUser := regexp.MustCompile(`nats://([^:@/]+):[^@]*@`)
	for name, svc := range project.Services {
		t.Run(name, func(t *testing.T) {
			for _, v := range svc.Volumes {
				if v.Type == types.VolumeTypeBind {
					_, err := os.Stat(v.Source)
					assert.NoError(t, err, "bind mount %s:%s", v.Source, v.Target)
				}
			}
			for _, u := range natsUser.FindAllStringSubmatch(stringOf(svc.Environment["NATS_URL"]), -1) {
				assert.Contains(t, string(accounts), "user: "+u[1]+",", "NATS user %s is not in deploy/nats/accounts.conf", u[1])
			}
			cmd := []string(svc.Command)
			require.NotEmpty(t, cmd, "a service without a command")
			if strings.HasPrefix(svc.Image, "nats:") {
				i := slices.Index(cmd, "-c")
				require.True(t, i >= 0 && i+1 < len(cmd), "nats-server runs with -c CONFIG")
				assert.FileExists(t, hostPath(t, svc, cmd[i+1]), "the nats-server config %s", cmd[i+1])
				return
			}
			require.True(t, len(cmd) >= 3 && cmd[0] == "go" && cmd[1] == "run", "a Go service runs `go run ./cmd/NAME`: %q", cmd)
			bin, ok := bins[path.Base(cmd[2])]
			require.True(t, ok, "%s is not a command of this repository", cmd[2])
			args := cmd[3:]
			// Subcommands come before the first flag.
			sub := args
			if i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "-") }); i >= 0 {
				sub = args[:i]
			}
			help := helpOf(t, bin, sub)
			for _, a := range args[len(sub):] {
				if !strings.HasPrefix(a, "-") {
					continue // a flag's value
				}
				flag, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				assert.Regexp(t, `(?m)^\s+--?`+regexp.QuoteMeta(flag)+`\b`, help, "%s %s has no flag %s", cmd[2], strings.Join(sub, " "), a)
			}
			for key := range svc.Environment {
				if strings.HasPrefix(key, "ACTIONBUS_") || strings.HasPrefix(key, "NATS_") {
					assert.Contains(t, help, key, "%s reads no %s (its --help does not name it)", cmd[2], key)
				}
			}
		})
	}
}

// TestTheComposeSchemaRefusesABrokenFile: the validation above can fail.
func TestTheComposeSchemaRefusesABrokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "compose.yml")
	require.NoError(t, os.WriteFile(file, []byte("services:\n  x:\n    image: nats:2.15\n    restart: sometimes\n    replicas: 3\n"), 0o600))
	opts, err := cli.NewProjectOptions([]string{file}, cli.WithWorkingDirectory(dir), cli.WithName("broken"), cli.WithEnv([]string{}),
		cli.WithLoadOptions(func(o *loader.Options) { o.SkipValidation = true }))
	require.NoError(t, err)
	model, err := opts.LoadModel(context.Background())
	require.NoError(t, err)
	assert.ErrorContains(t, composeschema.Validate(model), "replicas")
}

// buildCommands builds every command of cmd/ and returns each binary by
// its command's name.
func buildCommands(t *testing.T, root string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	require.NoError(t, err)
	pkgs := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, e := range entries {
		if e.IsDir() {
			pkgs = append(pkgs, "./cmd/"+e.Name())
		}
	}
	cmd := exec.Command("go", pkgs...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	bins := map[string]string{}
	for _, p := range pkgs[3:] {
		bins[path.Base(p)] = filepath.Join(dir, path.Base(p))
	}
	return bins
}

// helpOf is the --help text of bin's subcommand sub (a flag package's
// usage exits 2 after printing it, which is fine).
func helpOf(t *testing.T, bin string, sub []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append(slices.Clone(sub), "--help")...).CombinedOutput()
	if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
		require.NoError(t, err)
	}
	require.Contains(t, string(out), "-", "%s %v --help printed no flags", bin, sub)
	return string(out)
}

// hostPath is the file of the repository a container path of svc is, by
// its bind mounts.
func hostPath(t *testing.T, svc types.ServiceConfig, p string) string {
	t.Helper()
	for _, v := range svc.Volumes {
		if v.Type == types.VolumeTypeBind && (p == v.Target || strings.HasPrefix(p, v.Target+"/")) {
			return filepath.Join(v.Source, strings.TrimPrefix(p, v.Target))
		}
	}
	t.Fatalf("%s is in no bind mount of the service", p)
	return ""
}

func stringOf(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
