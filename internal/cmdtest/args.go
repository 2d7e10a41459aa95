package cmdtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// RepoRoot returns the repository's root: the nearest directory above the
// test's with a go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = parent
	}
}

// Flag is one flag of a command line and its value.
type Flag struct{ Name, Value string }

// SplitFlags lists the flags of a command line (as a deployment file
// writes it) with their values: the text after '=', or else the next
// argument when it is not a flag.
func SplitFlags(args []string) []Flag {
	var out []Flag
	for i, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			val = args[i+1]
		}
		out = append(out, Flag{name, val})
	}
	return out
}

// FlagValue returns the value of the first flag of args named one of
// names, and whether there is one.
func FlagValue(args []string, names ...string) (string, bool) {
	for _, f := range SplitFlags(args) {
		if slices.Contains(names, f.Name) {
			return f.Value, true
		}
	}
	return "", false
}

// Recorder collects the errors a check reports instead of failing the
// test: a test of the check shows it catches a broken input.
type Recorder struct {
	testing.TB
	Errs []string
}

func (r *Recorder) Errorf(format string, args ...any) {
	r.Errs = append(r.Errs, fmt.Sprintf(format, args...))
}
