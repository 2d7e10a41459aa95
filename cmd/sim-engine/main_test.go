package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/simengine"
)

// startRun starts run and returns the address it logged.
func startRun(t *testing.T, ctx context.Context, args []string, env map[string]string) (string, <-chan error) {
	t.Helper()
	attrs, done := startRunAttrs(t, ctx, args, env)
	return attrs["addr"], done
}

// startRunAttrs starts run and returns the attributes of its listening line.
func startRunAttrs(t *testing.T, ctx context.Context, args []string, env map[string]string) (map[string]string, <-chan error) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, args, func(k string) string { return env[k] }, io.Discard, pw)
		pw.CloseWithError(fmt.Errorf("run returned: %v", err))
		done <- err
	}()
	line := make(chan map[string]string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "msg=listening") {
				attrs := map[string]string{}
				for f := range strings.FieldsSeq(sc.Text()) {
					if k, v, ok := strings.Cut(f, "="); ok {
						attrs[k] = v
					}
				}
				line <- attrs
				break
			}
		}
		close(line)
	}()
	select {
	case attrs, ok := <-line:
		if !ok {
			t.Fatalf("run ended before listening: %v", <-done)
		}
		go func() { _, _ = io.Copy(io.Discard, pr) }()
		return attrs, done
	case <-time.After(10 * time.Second):
		t.Fatal("no listening line")
		return nil, nil
	}
}

func TestRunServesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addr, done := startRun(t, ctx,
		[]string{"--listen", "127.0.0.1:0", "--ttft", "0", "--itl", "0", "--slots", "2"},
		map[string]string{"SIM_ENGINE_MODEL": "env-model"})

	body := `{"model":"env-model","prompt":"Once upon a time,","max_tokens":5}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	var got struct {
		Model   string `json:"model"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || len(got.Choices) != 1 {
		t.Fatalf("%s: %v", raw, err)
	}
	x, err := simengine.Expect(simengine.APICompletion, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if got.Model != "env-model" || got.Choices[0].Text != x.Text {
		t.Fatalf("got %s, want text %q", raw, x.Text)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"bad flag", []string{"--nope"}, nil},
		{"bad slots", []string{"--slots", "0", "--listen", "127.0.0.1:0"}, nil},
		{"bad duration env", []string{"--listen", "127.0.0.1:0"}, map[string]string{"SIM_ENGINE_ITL": "fast"}},
		{"bad log level", []string{"--log-level", "loud", "--listen", "127.0.0.1:0"}, nil},
		{"bad listen", []string{"--listen", "127.0.0.1:notaport"}, nil},
		{"bad grpc listen", []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:notaport"}, nil},
		{"extra args", []string{"serve"}, nil},
		{"bad role", []string{"--role", "both", "--listen", "127.0.0.1:0"}, nil},
		{"bad pd protocol", []string{"--role", "decode", "--pd-protocol", "nixl", "--listen", "127.0.0.1:0"}, nil},
		{"bad bootstrap port", []string{"--role", "prefill", "--bootstrap-port", "-1", "--listen", "127.0.0.1:0"}, nil},
		{"bad bootstrap timeout env", []string{"--listen", "127.0.0.1:0"}, map[string]string{"SIM_ENGINE_BOOTSTRAP_TIMEOUT": "soon"}},
		{"bad load time", []string{"--load-time", "soon", "--listen", "127.0.0.1:0"}, nil},
		{"negative load time", []string{"--load-time", "-1s", "--listen", "127.0.0.1:0"}, nil},
		{"bad load time env", []string{"--listen", "127.0.0.1:0"}, map[string]string{"SIM_ENGINE_LOAD_TIME": "later"}},
		{"negative kv hold timeout", []string{"--role", "prefill", "--kv-hold-timeout", "-1s", "--listen", "127.0.0.1:0"}, nil},
		{"negative max batched tokens", []string{"--batch-model", "--max-batched-tokens", "-1", "--listen", "127.0.0.1:0"}, nil},
		{"negative step time", []string{"--batch-model", "--step-time", "-1ms", "--listen", "127.0.0.1:0"}, nil},
		{"bad step per seq env", []string{"--listen", "127.0.0.1:0"}, map[string]string{"SIM_ENGINE_STEP_PER_SEQ": "tiny"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(t.Context(), tc.args, func(k string) string { return tc.env[k] }, io.Discard, io.Discard)
			if err == nil {
				t.Fatal("run succeeded")
			}
		})
	}
}

func TestRunPrefillRole(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	attrs, done := startRunAttrs(t, ctx, []string{
		"--listen", "127.0.0.1:0", "--ttft", "0", "--itl", "0",
		"--role", "prefill", "--pd-protocol", "sglang", "--bootstrap-port", "0",
	}, map[string]string{"SIM_ENGINE_BOOTSTRAP_TIMEOUT": "200ms"})
	if attrs["role"] != "prefill" || attrs["pd_protocol"] != "sglang" || attrs["engine_id"] == "" {
		t.Fatalf("listening line %v", attrs)
	}
	bs := attrs["bootstrap_addr"]
	host, port, ok := strings.Cut(bs, ":")
	if !ok || host != "127.0.0.1" || port == "0" || port == "" {
		t.Fatalf("bootstrap_addr %q", bs)
	}
	httpGet := func(url string) (int, error) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := httpGet("http://" + bs + "/health"); err != nil || code != http.StatusOK {
		t.Fatalf("bootstrap /health: %d %v", code, err)
	}
	postStatus := func(body string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+attrs["addr"]+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := postStatus(`{"prompt":"hi"}`); code != http.StatusBadRequest {
		t.Fatalf("request without bootstrap fields: %d", code)
	}
	if code := postStatus(`{"prompt":"hi","bootstrap_host":"127.0.0.1","bootstrap_port":` + port + `,"bootstrap_room":9223372036854775807}`); code != http.StatusOK {
		t.Fatalf("prefill leg: %d", code)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if _, err := httpGet("http://" + bs + "/health"); err == nil {
		t.Fatal("bootstrap server still up after run returned")
	}
}

func TestRunPrefixCacheAndKVEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	attrs, done := startRunAttrs(t, ctx, []string{"--listen", "127.0.0.1:0", "--ttft", "0", "--itl", "0",
		"--enable-prefix-caching", "--prefix-cache-blocks", "32", "--block-size", "4",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","topic":"kv"}`},
		nil)
	ep := attrs["kv_events_endpoint"]
	if !strings.HasPrefix(ep, "tcp://127.0.0.1:") || attrs["prefix_cache_blocks"] != "32" || attrs["block_size"] != "4" {
		t.Fatalf("listening line %v", attrs)
	}
	body := `{"model":"sim-model","prompt":"one two three four five six seven eight nine","max_tokens":1}`
	for range 2 {
		resp, err := http.Post("http://"+attrs["addr"]+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := http.Get("http://" + attrs["addr"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`vllm:prefix_cache_queries_total{model_name="sim-model"} 18`,
		`vllm:prefix_cache_hits_total{model_name="sim-model"} 8`,
	} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run = %v", err)
	}
}

func TestRunRejectsBadKVEventsConfig(t *testing.T) {
	for _, args := range [][]string{
		{"--kv-events-config", `{`},
		{"--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:0"}`}, // no prefix caching
	} {
		err := run(t.Context(), append([]string{"--listen", "127.0.0.1:0"}, args...), func(string) string { return "" }, io.Discard, io.Discard)
		if err == nil {
			t.Errorf("run(%q) = nil", args)
		}
	}
}

// --batch-model serves the same text as the constant model, with the
// step flags (and their environment variables) taken.
func TestRunBatchModel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	attrs, done := startRunAttrs(t, ctx, []string{
		"--listen", "127.0.0.1:0", "--batch-model", "--max-batched-tokens", "4",
		"--step-time", "100us", "--step-per-seq", "10us", "--step-per-prefill-token", "1us",
	}, map[string]string{"SIM_ENGINE_KV_TRANSFER_PER_TOKEN": "2us"})
	if attrs["batch_model"] != "true" || attrs["max_batched_tokens"] != "4" || attrs["step_time"] != "100µs" ||
		attrs["step_per_seq"] != "10µs" || attrs["step_per_prefill_token"] != "1µs" || attrs["itl"] != "" {
		t.Fatalf("listening line %v", attrs)
	}
	body := `{"prompt":"a prompt longer than one chunk of four words","max_tokens":25,"stop":" zz"}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+attrs["addr"]+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || resp.StatusCode != http.StatusOK || len(got.Choices) != 1 {
		t.Fatalf("%d %s: %v", resp.StatusCode, raw, err)
	}
	x, err := simengine.Expect(simengine.APICompletion, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if got.Choices[0].Text != x.Text {
		t.Fatalf("got %q, want %q", got.Choices[0].Text, x.Text)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
