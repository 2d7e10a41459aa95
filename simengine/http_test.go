package simengine

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestHTTPErrors(t *testing.T) {
	e := newTestEngine(t, testConfig())
	srv := newTestServer(t, e)
	tests := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		typ    string
		param  string
		code   string
	}{
		{"bad json", "POST", "/v1/chat/completions", `{"messages":`, 400, "invalid_request_error", "", ""},
		{"not an object", "POST", "/v1/completions", `[1,2]`, 400, "invalid_request_error", "", ""},
		{"max_tokens string", "POST", "/v1/completions", `{"prompt":"hi","max_tokens":"x"}`, 400, "invalid_request_error", "", ""},
		{"max_tokens zero", "POST", "/v1/completions", `{"prompt":"hi","max_tokens":0}`, 400, "invalid_request_error", "max_tokens", ""},
		{"max_tokens too big", "POST", "/v1/completions", `{"prompt":"hi","max_tokens":1e9}`, 400, "invalid_request_error", "", ""},
		{"stream not bool", "POST", "/v1/completions", `{"prompt":"hi","stream":"yes"}`, 400, "invalid_request_error", "", ""},
		{"n=0", "POST", "/v1/chat/completions", chatJSON(`"n":0`, "user", "hi"), 400, "invalid_request_error", "n", ""},
		{"n too large", "POST", "/v1/completions", completionJSON("hi", `"n":17`), 400, "invalid_request_error", "n", ""},
		{"no messages", "POST", "/v1/chat/completions", `{"messages":[]}`, 400, "invalid_request_error", "messages", ""},
		{"no role", "POST", "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, 400, "invalid_request_error", "messages", ""},
		{"image part", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "invalid_request_error", "messages", ""},
		{"content number", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":3}]}`, 400, "invalid_request_error", "messages", ""},
		{"no prompt", "POST", "/v1/completions", `{"max_tokens":2}`, 400, "invalid_request_error", "prompt", ""},
		{"token ids", "POST", "/v1/completions", `{"prompt":[1,2,3]}`, 400, "invalid_request_error", "prompt", ""},
		{"two prompts", "POST", "/v1/completions", `{"prompt":["a","b"]}`, 400, "invalid_request_error", "prompt", ""},
		{"bad stop", "POST", "/v1/completions", `{"prompt":"a","stop":[1]}`, 400, "invalid_request_error", "stop", ""},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, 404, "invalid_request_error", "model", "model_not_found"},
		{"unknown model stream", "POST", "/v1/completions", `{"model":"gpt-9","prompt":"hi","stream":true}`, 404, "invalid_request_error", "model", "model_not_found"},
		{"GET completions", "GET", "/v1/completions", "", 405, "invalid_request_error", "", ""},
		{"POST models", "POST", "/v1/models", "{}", 405, "invalid_request_error", "", ""},
		{"unknown path", "GET", "/v1/audio/speech", "", 404, "not_found_error", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			var body map[string]map[string]any
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			ev := body["error"]
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := ev[k]; !ok {
					t.Fatalf("%s: no %q", raw, k)
				}
			}
			if ev["type"] != tc.typ || ev["message"] == "" {
				t.Fatalf("error %s", raw)
			}
			if tc.param != "" && ev["param"] != tc.param {
				t.Fatalf("param in %s, want %q", raw, tc.param)
			}
			if tc.code != "" && ev["code"] != tc.code {
				t.Fatalf("code in %s, want %q", raw, tc.code)
			}
			if tc.status == 405 && resp.Header.Get("Allow") == "" {
				t.Fatal("no Allow header")
			}
		})
	}
	if e.Aborted() != 0 {
		t.Fatalf("refused requests counted as aborted: %d", e.Aborted())
	}
}

func TestStreamRefusalIsError(t *testing.T) {
	e := newTestEngine(t, testConfig())
	err := e.Stream(t.Context(), APIChat, []byte(`{"model":"other","messages":[{"role":"user","content":"hi"}]}`), func([]byte) error {
		t.Fatal("emit called")
		return nil
	})
	se, ok := err.(*Error)
	if !ok || se.Status != http.StatusNotFound || se.Code != "model_not_found" {
		t.Fatalf("err %#v", err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHTTPInfoEndpoints(t *testing.T) {
	e := newTestEngine(t, testConfig())
	srv := newTestServer(t, e)

	if code, _ := get(t, srv.URL+"/health"); code != 200 {
		t.Fatalf("/health %d", code)
	}

	code, body := get(t, srv.URL+"/v1/models")
	var raw struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &raw); code != 200 || err != nil {
		t.Fatalf("/v1/models %d %s %v", code, body, err)
	}
	if raw.Object != "list" || len(raw.Data) != 1 || raw.Data[0]["id"] != "sim-model" ||
		raw.Data[0]["object"] != "model" || raw.Data[0]["owned_by"] != "switchyard-sim" || raw.Data[0]["created"] == nil {
		t.Fatalf("/v1/models %s", body)
	}

	code, body = get(t, srv.URL+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics %d", code)
	}
	for _, want := range []string{
		`vllm:num_requests_running{model_name="sim-model"} 0`,
		`vllm:num_requests_waiting{model_name="sim-model"} 0`,
		`vllm:kv_cache_usage_perc{model_name="sim-model"} 0`,
		`# TYPE vllm:num_requests_running gauge`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
}
