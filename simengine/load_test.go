package simengine

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/vllmpb"
)

// send makes one HTTP request and returns its status and body.
func send(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// While loading, every route but /metrics answers 503 in the OpenAI error
// shape, gRPC answers Unavailable but for the load reports, and Stream and
// Health fail with ErrLoading.
func TestLoading(t *testing.T) {
	for _, tc := range []struct {
		name     string
		loadTime time.Duration
		message  string
	}{
		{"an hour", time.Hour, "is loading"},
		{"never", LoadNever, "never finishes loading"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.LoadTime = tc.loadTime
			e := newTestEngine(t, cfg)
			srv := newTestServer(t, e)
			if e.Loaded() {
				t.Fatal("Loaded at start")
			}
			err := e.Health()
			if se, ok := errors.AsType[*Error](err); !ok || !errors.Is(err, ErrLoading) || se.Status != 503 || !strings.Contains(se.Message, tc.message) {
				t.Fatalf("Health: %v", err)
			}
			for _, r := range []struct{ method, path, body string }{
				{http.MethodGet, "/health", ""},
				{http.MethodHead, "/health", ""},
				{http.MethodGet, "/v1/models", ""},
				{http.MethodPost, "/v1/chat/completions", chatJSON("", "user", "hi")},
				{http.MethodPost, "/v1/completions", completionJSON("hi", `"stream":true`)},
			} {
				code, body := send(t, r.method, srv.URL+r.path, r.body)
				if code != http.StatusServiceUnavailable {
					t.Errorf("%s %s: %d %s", r.method, r.path, code, body)
				}
				if r.method != http.MethodHead && !strings.Contains(body, `"code":"`+CodeModelLoading+`"`) {
					t.Errorf("%s %s: body %s", r.method, r.path, body)
				}
			}
			if code, body := get(t, srv.URL+"/metrics"); code != 200 || !strings.Contains(body, `switchyard_sim_loaded{model_name="sim-model"} 0`) {
				t.Errorf("/metrics %d:\n%s", code, body)
			}
			if _, err := stream(t, e, APIChat, chatJSON("", "user", "hi")); !errors.Is(err, ErrLoading) {
				t.Errorf("Stream: %v", err)
			}

			c := grpcClient(t, e)
			if _, err := c.HealthCheck(t.Context(), &vllmpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
				t.Errorf("HealthCheck: %v", err)
			}
			if _, err := c.GetModelInfo(t.Context(), &vllmpb.GetModelInfoRequest{}); status.Code(err) != codes.Unavailable {
				t.Errorf("GetModelInfo: %v", err)
			}
			if _, _, err := generate(t, t.Context(), c, &vllmpb.GenerateRequest{Input: &vllmpb.GenerateRequest_Text{Text: "hi"}}); status.Code(err) != codes.Unavailable {
				t.Errorf("Generate: %v", err)
			}
			if _, err := c.GetLoads(t.Context(), &vllmpb.GetLoadsRequest{}); err != nil {
				t.Errorf("GetLoads: %v", err)
			}
			if e.Aborted() != 0 || e.Load() != (Load{}) {
				t.Errorf("aborted %d load %+v", e.Aborted(), e.Load())
			}
		})
	}
}

// An engine becomes healthy once its load time has passed, and then serves.
func TestLoadsAfterLoadTime(t *testing.T) {
	cfg := testConfig()
	cfg.LoadTime = 50 * time.Millisecond
	e := newTestEngine(t, cfg)
	srv := newTestServer(t, e)
	c := grpcClient(t, e)
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if code, body := get(t, srv.URL+"/health"); code != http.StatusOK {
			return fmt.Errorf("/health %d %s", code, body)
		}
		return nil
	})
	if !e.Loaded() || e.Health() != nil {
		t.Fatalf("Loaded %v Health %v", e.Loaded(), e.Health())
	}
	body := chatJSON(`"max_tokens":5`, "user", "hi")
	res := do(t, t.Context(), srv.URL, APIChat, body)
	res.matches(t, APIChat, body)
	if h, err := c.HealthCheck(t.Context(), &vllmpb.HealthCheckRequest{}); err != nil || !h.GetHealthy() {
		t.Fatalf("HealthCheck %v %v", h, err)
	}
	if code, body := get(t, srv.URL+"/metrics"); code != 200 || !strings.Contains(body, `switchyard_sim_loaded{model_name="sim-model"} 1`) {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
}
