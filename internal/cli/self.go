package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// selfCommand is how to run this very program again, for the commands a
// hint prints: "go run ./cmd/actionbus" only when it runs under go run
// (its executable is go run's build, an "exe" directory under a
// "go-build" temporary one); otherwise the name it was started by: the
// base name when that finds this executable on $PATH, else the path
// given (os.Args[0]).
func selfCommand() string {
	exe, _ := os.Executable()
	return commandFor(os.Args[0], exe, exec.LookPath)
}

// commandFor is selfCommand for a program started as arg0 whose
// executable is exe, with lookPath finding a name on $PATH.
func commandFor(arg0, exe string, lookPath func(string) (string, error)) string {
	if underGoRun(exe) {
		return "go run ./cmd/actionbus"
	}
	base := filepath.Base(arg0)
	if base == arg0 {
		return arg0
	}
	if found, err := lookPath(base); err == nil && sameFile(found, exe) {
		return base
	}
	return arg0
}

// underGoRun reports whether exe is an executable go run built: go run
// links it as $GOTMPDIR/go-build…/…/exe/NAME and removes it on exit, and
// since Go 1.24 runs a build it has cached from the build cache itself,
// as $GOCACHE/<2 hex>/<hash>-d/NAME.
func underGoRun(exe string) bool {
	dir := filepath.Dir(exe)
	if cached := filepath.Base(dir); strings.HasSuffix(cached, "-d") && len(cached) > 4 &&
		isHex(strings.TrimSuffix(cached, "-d")) && filepath.Base(filepath.Dir(dir)) == cached[:2] {
		return true
	}
	if filepath.Base(dir) != "exe" {
		return false
	}
	for d := filepath.Dir(dir); d != filepath.Dir(d); d = filepath.Dir(d) {
		if strings.HasPrefix(filepath.Base(d), "go-build") {
			return true
		}
	}
	return false
}

// isHex reports whether s is made of lower-case hexadecimal digits only.
func isHex(s string) bool {
	return strings.Trim(s, "0123456789abcdef") == ""
}

// sameFile reports whether two paths name the same file.
func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}
