package helmtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// helmVersion is the helm release the tests build from the Go module proxy.
const helmVersion = "v4.3.2"

// kubeVersion is the Kubernetes version the chart is rendered for: the
// lowest the chart supports (the preStop sleep action is on by default
// from 1.30).
const kubeVersion = "1.30.0"

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary returns the path of a helm binary of helmVersion, built with
// `go install helm.sh/helm/v4/cmd/helm@version` outside this module the
// first time and kept under the user's cache directory, keyed by version
// and the Go toolchain's.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = buildHelm(t) })
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

func buildHelm(t *testing.T) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "switchyard-helmtest", "helm-"+helmVersion+"-"+runtime.Version())
	bin := filepath.Join(dir, "helm")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	gobin, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(gobin)
	start := time.Now()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "install", "helm.sh/helm/v4/cmd/helm@"+helmVersion)
	// Outside this module, so helm's dependencies stay out of go.mod.
	cmd.Dir = gobin
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install helm %s: %v\n%s", helmVersion, err, out)
	}
	t.Logf("built helm %s in %v", helmVersion, time.Since(start).Round(time.Second))
	// Rename is atomic: a concurrent run sees the whole binary or none.
	if err := os.Rename(filepath.Join(gobin, "helm"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// helm runs the helm binary with a private home, so no repository or
// plugin of the user's takes part, and returns its standard output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

func chartDir(t *testing.T) string {
	return filepath.Join(cmdtest.RepoRoot(t), "deploy", "helm", "switchyard")
}

// render runs helm template on chart with the values files and --set
// pairs, and returns the rendered objects.
func render(t *testing.T, chart string, valueFiles []string, sets ...string) []object {
	t.Helper()
	args := []string{"template", "rel", chart, "--namespace", "sy", "--kube-version", kubeVersion}
	for _, f := range valueFiles {
		args = append(args, "-f", f)
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAll(t, out)
}

// TestHelmBuilds: the helm the other tests run is the pinned release.
// .ci/run runs it alone before the suite, so a cold build of helm is not
// timed against the suite's deadline.
func TestHelmBuilds(t *testing.T) {
	out, err := helm(t, "version", "--template", "{{.Version}}")
	if err != nil {
		t.Fatal(err)
	}
	// helm prints its major.minor (v4.3) or the full version.
	if v := strings.TrimSpace(out); v == "" || !strings.HasPrefix(helmVersion, v) {
		t.Errorf("helm version %q, want %s", v, helmVersion)
	}
}
