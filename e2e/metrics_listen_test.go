package e2e

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

var metricsLine = regexp.MustCompile(`metrics=(\S+)`)

// TestMetricsListenWithoutKeys: with API keys, /metrics on the API's
// listener asks for a key, while --metrics-listen serves /metrics,
// /healthz and /readyz without one, and nothing else.
func TestMetricsListenWithoutKeys(t *testing.T) {
	b := cmdtest.StartBroker(t, "--api-key", "sk-test", "--metrics-listen", "127.0.0.1:0")
	m := metricsLine.FindStringSubmatch(b.Out.String())
	if m == nil {
		t.Fatalf("no metrics address in the listening line: %s", b.Out.String())
	}
	mbase := m[1]
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, readAll(resp)
	}
	if code, _ := get(b.HTTP + "/metrics"); code != http.StatusUnauthorized {
		t.Fatalf("API listener /metrics without a key: %d, want 401", code)
	}
	code, body := get(mbase + "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "switchyard_requests_in_flight") {
		t.Fatalf("metrics listener /metrics: %d %.200s", code, body)
	}
	if code, body := get(mbase + "/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("metrics listener /readyz: %d %q", code, body)
	}
	if code, _ := get(mbase + "/healthz"); code != http.StatusOK {
		t.Fatalf("metrics listener /healthz: %d", code)
	}
	for _, path := range []string{"/v1/models", "/v1/fleet", "/"} {
		if code, _ := get(mbase + path); code != http.StatusNotFound {
			t.Fatalf("metrics listener %s: %d, want 404: it serves only metrics and probes", path, code)
		}
	}
}
