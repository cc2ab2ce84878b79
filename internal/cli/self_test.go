package cli

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHintsNameTheProgramRunning: the command a hint prints is go run's
// only under go run, the bare name when $PATH finds this executable by
// it, and the path it was started by otherwise.
func TestHintsNameTheProgramRunning(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "actionbus")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o700))
	other := filepath.Join(t.TempDir(), "actionbus")
	require.NoError(t, os.WriteFile(other, []byte("#!/bin/sh\n"), 0o700))
	onPath := func(found string) func(string) (string, error) {
		return func(string) (string, error) { return found, nil }
	}
	notOnPath := func(string) (string, error) { return "", errors.New("not found") }
	goRun := filepath.Join(os.TempDir(), "go-build1234", "b001", "exe", "actionbus")

	assert.Equal(t, "go run ./cmd/actionbus", commandFor(goRun, goRun, notOnPath), "under go run")
	cached := filepath.Join(os.TempDir(), "cache", "d1", "d1d04382821c8c4d51bca7dda1c411a272bdd4343cc741a219e720579a6ee1a3-d", "actionbus")
	assert.Equal(t, "go run ./cmd/actionbus", commandFor(cached, cached, notOnPath), "under go run, a build it cached")
	notCached := filepath.Join(os.TempDir(), "cache", "zz", "release-d", "actionbus")
	assert.Equal(t, notCached, commandFor(notCached, notCached, notOnPath), "a directory that only ends in -d")
	assert.Equal(t, "actionbus", commandFor("actionbus", bin, onPath(bin)), "started from $PATH")
	assert.Equal(t, "actionbus", commandFor(bin, bin, onPath(bin)), "started by its path, which $PATH finds by name")
	assert.Equal(t, "./bin/actionbus", commandFor("./bin/actionbus", bin, onPath(other)), "$PATH finds another actionbus")
	assert.Equal(t, "./bin/actionbus", commandFor("./bin/actionbus", bin, notOnPath), "not on $PATH")
	testBin := filepath.Join(os.TempDir(), "go-build1234", "b001", "cli.test")
	assert.Equal(t, testBin, commandFor(testBin, testBin, notOnPath), "go test's binary is not go run's")
}
