package cmdtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	binMu   sync.Mutex
	binOnce = map[string]*sync.Once{}
	binPath = map[string]string{}
	binErr  = map[string]error{}
)

// binDir holds the tests' binaries, keyed by Go version so a cached
// nats-server is never one built by another toolchain, and by the
// checkout, so tests of two checkouts running at once never run each
// other's commands.
func binDir() string {
	sum := sha256.Sum256([]byte(moduleRoot()))
	return filepath.Join(os.TempDir(), "switchyard-e2e-bin-"+runtime.Version()+"-"+hex.EncodeToString(sum[:4]))
}

// moduleRoot is the directory of the go.mod above the test's working
// directory (its package's), or that directory when there is none.
func moduleRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return wd
		}
	}
}

// BuildBinary builds pkg (a package path of this module or a dependency)
// once per test binary and returns the path of the executable. Commands of
// this module are built every run (reuse false: the build cache makes that
// quick) so they are never stale; a pinned dependency such as nats-server
// is reused across runs (reuse true).
func BuildBinary(t testing.TB, pkg, name string, reuse bool) string {
	t.Helper()
	binMu.Lock()
	once := binOnce[pkg]
	if once == nil {
		once = new(sync.Once)
		binOnce[pkg] = once
	}
	binMu.Unlock()
	once.Do(func() {
		dir := binDir()
		if reuse {
			// A reused binary is one of the version go.mod pins now.
			name += "-" + moduleVersion(pkg)
		}
		path := filepath.Join(dir, name)
		var err error
		defer func() {
			binMu.Lock()
			binPath[pkg], binErr[pkg] = path, err
			binMu.Unlock()
		}()
		if reuse {
			if _, statErr := os.Stat(path); statErr == nil {
				return
			}
		}
		if err = os.MkdirAll(dir, 0o755); err != nil {
			return
		}
		// Build beside and rename, so a concurrent test binary never runs a
		// half-written file.
		tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", tmp, pkg)
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build %s: %v\n%s", pkg, berr, out)
			return
		}
		err = os.Rename(tmp, path)
	})
	binMu.Lock()
	defer binMu.Unlock()
	if binErr[pkg] != nil {
		t.Fatal(binErr[pkg])
	}
	return binPath[pkg]
}

// moduleVersion is the version of the module that provides pkg in this
// module's build, "unknown" if go list cannot tell.
func moduleVersion(pkg string) string {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list",
		"-f", "{{with .Module}}{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}{{end}}", pkg).Output()
	if v := strings.TrimSpace(string(out)); err == nil && v != "" {
		return v
	}
	return "unknown"
}

// NATSServerBinary returns a nats-server built from the version go.mod
// pins.
func NATSServerBinary(t testing.TB) string {
	t.Helper()
	return BuildBinary(t, "github.com/nats-io/nats-server/v2", "nats-server", true)
}
