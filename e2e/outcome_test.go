package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// refusingEngine is a sim-engine that refuses every chat completion with
// 400, as an engine does with a request it judges invalid (a prompt
// beyond its context, a parameter it does not take).
func refusingEngine(t *testing.T) *engine {
	t.Helper()
	se, err := simengine.New(simengineConfig(model))
	if err != nil {
		t.Fatal(err)
	}
	h := se.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"message":"This model's maximum context length is 8 tokens.","type":"invalid_request_error","param":"messages"}}`))
			return
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	e := &engine{Engine: se, URL: "http://" + ln.Addr().String(), Stop: func() { _ = srv.Close(); _ = se.Close() }}
	t.Cleanup(e.Stop)
	cmdtest.WaitHealthy(t, e.URL)
	return e
}

// TestEngineRefusalIsClientError: a request its engine refuses as invalid
// counts as client_error, not error, on the broker and on the agent.
func TestEngineRefusalIsClientError(t *testing.T) {
	b := cmdtest.StartBroker(t)
	agentMetrics := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	startAgent(t, b.NATS, "a1", refusingEngine(t), 4, "--metrics-listen", strings.TrimPrefix(agentMetrics, "http://"))
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	resp, err := http.Post(b.HTTP+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"far too long"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want the engine's 400", resp.StatusCode)
	}
	for _, c := range []struct{ url, name string }{
		{b.HTTP + "/metrics", `switchyard_requests_total{model="` + model + `",outcome="client_error",route="regular"}`},
		{agentMetrics + "/metrics", `switchyard_agent_jobs_total{outcome="client_error"}`},
	} {
		// The broker counts the request as its handler closes it, which
		// may be just after the client read the answer.
		testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
			if v := scrapeValue(c.url, c.name); v != "1" {
				return fmt.Errorf("%s = %q, want 1", c.name, v)
			}
			return nil
		})
	}
	for _, c := range []struct{ url, name string }{
		{b.HTTP + "/metrics", `switchyard_requests_total{model="` + model + `",outcome="error",route="regular"}`},
		{agentMetrics + "/metrics", `switchyard_agent_jobs_total{outcome="error"}`},
	} {
		if v := scrapeValue(c.url, c.name); v != "" && v != "0" {
			t.Errorf("%s = %q, want 0", c.name, v)
		}
	}
}
