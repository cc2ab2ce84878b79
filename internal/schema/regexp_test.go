package schema

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// classRunPatterns are patterns of the shape the direct scan takes: the
// schemas' own and harder ones (overlapping classes, bounds, negated and
// Unicode classes, case folding).
var classRunPatterns = []string{
	`^[0-9a-f]{64}$`, `^[a-z][a-z0-9_]*$`, `^[a-z0-9][a-z0-9_-]{0,31}$`, `^[0-9A-Za-z_-]{1,64}$`,
	`^[a-z]$`, `^[a-z]+$`, `^[a-z]?$`, `^[ab]{2}[a-c]{0,2}$`, `^[^/]{1,3}$`, `^\d{2,}$`, `^(?i)[a-c]{1,2}$`,
	`^[\p{L}_]{1,4}$`, `^\w[\w.]*$`,
}

func TestOnlyAnchoredClassRunsAreScanned(t *testing.T) {
	for _, p := range classRunPatterns {
		_, ok := classRunsOf(p)
		assert.True(t, ok, "%s is scanned", p)
	}
	for _, p := range []string{
		`[a-z]+`, `^[a-z]+`, `[a-z]+$`, `^([0-9a-f]{64})?$`, `^a$`, `^.{1,3}$`, `^[a-z]{1,3}[a-z]$`,
		`^[a-z]*?$`, `^(a|b)$`, `^[a-z]+\.[a-z]+$`, `(?m)^[a-z]$`,
	} {
		_, ok := classRunsOf(p)
		assert.False(t, ok, "%s is left to regexp", p)
	}
}

func TestClassRunsMatchAsRegexpDoes(t *testing.T) {
	inputs := []string{"", "a", "ab", "abc", "abcd", "A", "aB", "a_b", "a-b", "0", "00", "012", "a/b", "é", "ǅx", "\xff", "a\xff",
		"a\n", "\na", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde", "x.y", "abcdefghijklmnopqrstuvwxyzabcdefghijk"}
	for _, p := range classRunPatterns {
		fast, err := compileRegexp(p)
		require.NoError(t, err)
		_, scanned := fast.(*classRuns)
		require.True(t, scanned, p)
		re := regexp.MustCompile(p)
		for _, in := range inputs {
			assert.Equal(t, re.MatchString(in), fast.MatchString(in), "%s on %q", p, in)
		}
	}
}

func FuzzClassRunsMatchAsRegexpDoes(f *testing.F) {
	for i, p := range classRunPatterns {
		f.Add(uint8(i), "ab_1")
		f.Add(uint8(i), p)
	}
	compiled := make([]*classRuns, len(classRunPatterns))
	std := make([]*regexp.Regexp, len(classRunPatterns))
	for i, p := range classRunPatterns {
		fast, err := compileRegexp(p)
		require.NoError(f, err)
		compiled[i], std[i] = fast.(*classRuns), regexp.MustCompile(p)
	}
	f.Fuzz(func(t *testing.T, which uint8, s string) {
		i := int(which) % len(classRunPatterns)
		if got, want := compiled[i].MatchString(s), std[i].MatchString(s); got != want {
			t.Fatalf("%s on %q: scan %v, regexp %v", classRunPatterns[i], s, got, want)
		}
	})
}

// Any pattern the scan takes, not only the listed ones, matches as regexp
// does.
func FuzzScannedPatternsMatchAsRegexpDoes(f *testing.F) {
	for _, p := range classRunPatterns {
		f.Add(p, "ab_1")
	}
	f.Add(`^[a-c]{2}[b-d]*$`, "abbd")
	f.Fuzz(func(t *testing.T, pattern, s string) {
		re, err := regexp.Compile(pattern)
		if err != nil {
			return
		}
		runs, ok := classRunsOf(pattern)
		if !ok {
			return
		}
		scan := &classRuns{pattern: pattern, runs: runs}
		if got, want := scan.MatchString(s), re.MatchString(s); got != want {
			t.Fatalf("%s on %q: scan %v, regexp %v", pattern, s, got, want)
		}
	})
}
