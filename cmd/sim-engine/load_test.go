package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/vllmpb"
)

// call makes one HTTP request and returns its status and body.
func call(t *testing.T, method, url, body string) (int, string) {
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

// poll calls f until it returns nil, failing after 10s.
func poll(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// --load-time holds the engine unhealthy, over HTTP and gRPC, until it has
// passed; never holds it so for good.
func TestRunLoadTime(t *testing.T) {
	for _, tc := range []struct {
		name, flag, logged string
		loads              bool
	}{
		{"an hour", "1h", "1h0m0s", false},
		{"never", "never", "never", false},
		{"short", "50ms", "50ms", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			attrs, done := startRunAttrs(t, ctx, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
				"--ttft", "0", "--itl", "0", "--load-time", tc.flag}, nil)
			if attrs["load_time"] != tc.logged {
				t.Fatalf("listening line %v", attrs)
			}
			base := "http://" + attrs["addr"]
			conn, err := grpc.NewClient(attrs["grpc_addr"], grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			gc := vllmpb.NewVllmEngineClient(conn)
			completion := `{"prompt":"hi","max_tokens":3}`
			if tc.loads {
				poll(t, func() error {
					if code, body := call(t, http.MethodGet, base+"/health", ""); code != http.StatusOK {
						return fmt.Errorf("/health %d %s", code, body)
					}
					return nil
				})
				if code, body := call(t, http.MethodPost, base+"/v1/completions", completion); code != http.StatusOK {
					t.Fatalf("completion %d %s", code, body)
				}
				if h, err := gc.HealthCheck(t.Context(), &vllmpb.HealthCheckRequest{}); err != nil || !h.GetHealthy() {
					t.Fatalf("HealthCheck %v %v", h, err)
				}
			} else {
				for _, r := range []struct{ method, path, body string }{
					{http.MethodGet, "/health", ""},
					{http.MethodGet, "/v1/models", ""},
					{http.MethodPost, "/v1/completions", completion},
				} {
					if code, body := call(t, r.method, base+r.path, r.body); code != http.StatusServiceUnavailable {
						t.Errorf("%s %s: %d %s", r.method, r.path, code, body)
					}
				}
				if _, err := gc.HealthCheck(t.Context(), &vllmpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
					t.Errorf("HealthCheck: %v", err)
				}
				if code, body := call(t, http.MethodGet, base+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, "switchyard_sim_loaded") {
					t.Errorf("/metrics %d %s", code, body)
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("run: %v", err)
			}
		})
	}
}

// --kv-hold-timeout bounds how long a prefill engine holds a hand-off no
// decode reads; /metrics shows the hold and its expiry.
func TestRunKVHoldTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	attrs, done := startRunAttrs(t, ctx, []string{"--listen", "127.0.0.1:0", "--ttft", "0", "--itl", "0",
		"--role", "prefill", "--pd-protocol", "vllm", "--bootstrap-port", "0", "--kv-hold-timeout", "100ms"}, nil)
	if attrs["kv_hold_timeout"] != "100ms" {
		t.Fatalf("listening line %v", attrs)
	}
	base := "http://" + attrs["addr"]
	code, body := call(t, http.MethodPost, base+"/v1/completions",
		`{"prompt":"`+strings.Repeat("tok ", 40)+`","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)
	var resp struct {
		KV struct {
			Blocks []int `json:"remote_block_ids"`
		} `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal([]byte(body), &resp); code != http.StatusOK || err != nil || len(resp.KV.Blocks) != 3 {
		t.Fatalf("prefill %d %s (%v): want 3 blocks for 40 tokens", code, body, err)
	}
	poll(t, func() error {
		_, m := call(t, http.MethodGet, base+"/metrics", "")
		for _, want := range []string{
			`switchyard_sim_pd_handoffs_expired_total{model_name="sim-model"} 1`,
			`switchyard_sim_pd_handoffs_held{model_name="sim-model"} 0`,
			`switchyard_sim_pd_kv_held_blocks{model_name="sim-model"} 0`,
		} {
			if !strings.Contains(m, want) {
				return fmt.Errorf("/metrics lacks %q:\n%s", want, m)
			}
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
