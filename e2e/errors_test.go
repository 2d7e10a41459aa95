package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// TestHTTPErrors: every error case of the HTTP ingress answers in OpenAI's
// error shape with the right status, and none hangs.
func TestHTTPErrors(t *testing.T) {
	b := cmdtest.StartBroker(t, "--max-body", "4096")
	e := fastEngine(t, 4)
	// a1 must stay live through every case ("unknown model" names the
	// served ones): with 100ms heartbeats it went stale for 300ms of CPU
	// starvation under load (a gap of 225ms was measured on an idle agent
	// on a busy 2-core machine), 1s ones keep it live for 3s of silence.
	startAgent(t, b.NATS, "a1", e, 4, "--heartbeat", "1s")
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	// A second model whose only agent has drained: known, but no capacity.
	e2 := startEngine(t, simengineConfig("gone-model"))
	gone := startAgent(t, b.NATS, "a2", e2, 2, "--model", "gone-model")
	cmdtest.WaitEligible(t, b.HTTP, "a2")
	if err := gone.Stop(t); err != nil {
		t.Fatal(err)
	}

	chat := b.HTTP + "/v1/chat/completions"
	for _, tc := range []struct {
		name, method, url, body string
		status                  int
		code, param, contains   string
	}{
		{"malformed json", "POST", chat, `{"model":`, 400, "invalid_json", "", ""},
		{"not an object", "POST", chat, `[1,2]`, 400, "invalid_type", "", ""},
		{"trailing data", "POST", chat, `{"messages":[{"role":"user","content":"x"}]} {}`, 400, "invalid_json", "", ""},
		{"wrong type max_tokens", "POST", chat, `{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}`, 400, "invalid_type", "max_tokens", ""},
		{"wrong type stream", "POST", chat, `{"messages":[{"role":"user","content":"x"}],"stream":"yes"}`, 400, "invalid_type", "stream", ""},
		{"no messages", "POST", chat, `{"model":"sim-model"}`, 400, "invalid_value", "messages", ""},
		{"message without role", "POST", chat, `{"messages":[{"content":"x"}]}`, 400, "invalid_value", "messages[0].role", ""},
		{"zero max_tokens", "POST", chat, `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, "invalid_value", "max_tokens", ""},
		{"n too large", "POST", chat, `{"messages":[{"role":"user","content":"x"}],"n":1000}`, 400, "invalid_value", "n", ""},
		{"stop wrong type", "POST", chat, `{"messages":[{"role":"user","content":"x"}],"stop":7}`, 400, "invalid_type", "stop", ""},
		{"invalid utf8", "POST", chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", 400, "invalid_encoding", "", ""},
		{"completion without prompt", "POST", b.HTTP + "/v1/completions", `{"model":"sim-model"}`, 400, "invalid_value", "prompt", ""},
		{"unknown model", "POST", chat, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found", "model", "sim-model"},
		{"known model without live agent", "POST", chat, `{"model":"gone-model","messages":[{"role":"user","content":"x"}]}`, 503, "no_capacity", "", "gone-model"},
		{"body too large", "POST", chat, `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, 413, "body_too_large", "", ""},
		{"wrong method", "GET", chat, "", 405, "method_not_allowed", "", ""},
		{"wrong method models", "POST", b.HTTP + "/v1/models", "{}", 405, "method_not_allowed", "", ""},
		{"unknown path", "GET", b.HTTP + "/v1/nothing", "", 404, "not_found", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.url, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error *struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("status %d: body is not JSON: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != tc.status || e.Error == nil {
				t.Fatalf("status %d error %+v, want %d", resp.StatusCode, e.Error, tc.status)
			}
			if e.Error.Code == nil || *e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("error %+v, want code %q", *e.Error, tc.code)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
				t.Fatalf("param %v, want %q", e.Error.Param, tc.param)
			}
			if !strings.Contains(e.Error.Message, tc.contains) {
				t.Fatalf("message %q does not name %q", e.Error.Message, tc.contains)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("content type %q", ct)
			}
			if tc.status == 405 && resp.Header.Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
			if tc.status == 503 && resp.Header.Get("Retry-After") == "" {
				t.Fatal("503 without Retry-After")
			}
		})
	}

	t.Run("no model with two served", func(t *testing.T) {
		e3 := startEngine(t, simengineConfig("other-model"))
		startAgent(t, b.NATS, "a3", e3, 2, "--model", "other-model")
		cmdtest.WaitEligible(t, b.HTTP, "a3")
		status, body := post(t, chat, `{"messages":[{"role":"user","content":"x"}]}`)
		if status != 400 || !strings.Contains(body, "model_required") || !strings.Contains(body, "other-model") || !strings.Contains(body, "sim-model") {
			t.Fatalf("status %d body %s", status, body)
		}
	})

	t.Run("request id echoed", func(t *testing.T) {
		req, _ := http.NewRequest("POST", chat, strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":2}`))
		req.Header.Set("X-Request-Id", "client-id-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "client-id-42" {
			t.Fatalf("status %d id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
		}
		resp2, err := http.Post(chat, "application/json", strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		resp2.Body.Close()
		if resp2.Header.Get("X-Request-Id") == "" {
			t.Fatal("no request id made")
		}
	})

	t.Run("health and readiness", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get(b.HTTP + p)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s: %d", p, resp.StatusCode)
			}
		}
	})
}
