package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/simengine"
)

func simServer(t *testing.T) string {
	t.Helper()
	eng, err := simengine.New(simengine.Config{Model: "m", TTFT: 5 * time.Millisecond, ITL: time.Millisecond, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func noenv(string) string { return "" }

func TestRunJSON(t *testing.T) {
	url := simServer(t)
	dir := t.TempDir()
	prompts := filepath.Join(dir, "p.jsonl")
	if err := os.WriteFile(prompts, []byte(`{"prompt":"one two three","max_tokens":4}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(dir, "raw.jsonl")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"--url", url, "--model", "m", "--rate", "200", "--concurrency", "4", "--requests", "12",
		"--warmup", "2", "--prompts", prompts, "--slo", "ttft=1s,tpot=100ms", "--json", "--raw-out", raw,
	}, noenv, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep map[string]any
	dec := json.NewDecoder(&stdout)
	if err := dec.Decode(&rep); err != nil {
		t.Fatal(err)
	}
	if dec.More() {
		t.Fatal("stdout holds more than one JSON object")
	}
	if rep["requests"] != 12.0 || rep["completed"] != 12.0 {
		t.Fatalf("report %v", rep)
	}
	for _, k := range []string{"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "errors", "config", "goodput_per_s"} {
		if _, ok := rep[k]; !ok {
			t.Fatalf("no %q in %v", k, rep)
		}
	}
	if stderr.Len() != 0 {
		t.Fatalf("stderr not a terminal and no --progress, yet: %q", stderr.String())
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n != 14 {
		t.Fatalf("%d raw lines, want 14", n)
	}
}

func TestRunTableAndProgress(t *testing.T) {
	url := simServer(t)
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"--url", url, "--model", "m", "--requests", "5", "--api", "completion",
		"--prompt-tokens", "uniform:2-8", "--max-tokens", "uniform:2-4", "--progress",
	}, noenv, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "TTFT") || !strings.Contains(stdout.String(), "5 measured, 5 completed") {
		t.Fatalf("table:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "100%") {
		t.Fatalf("no finished progress bar on stderr: %q", stderr.String())
	}
}

func TestRunBadFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no model", []string{"--requests", "1"}, "model"},
		{"bad dist", []string{"--model", "m", "--prompt-tokens", "normal:3"}, "--prompt-tokens"},
		{"bad warmup", []string{"--model", "m", "--warmup", "soon"}, "--warmup"},
		{"bad slo", []string{"--model", "m", "--slo", "itl=3ms"}, "--slo"},
		{"prompts and lengths", []string{"--model", "m", "--prompts", "x.jsonl", "--prompt-tokens", "3"}, "exclusive"},
		{"stray argument", []string{"--model", "m", "extra"}, "unexpected"},
		{"unknown flag", []string{"--nope"}, "nope"},
		{"missing ca file", []string{"--model", "m", "--ca-file", "/nonexistent/ca.pem"}, "--ca-file"},
		{"ca file without pem", []string{"--model", "m", "--ca-file", "main_test.go"}, "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tc.args, noenv, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
				t.Fatalf("err = %v (stderr %q), want it to mention %q", err, stderr.String(), tc.want)
			}
		})
	}
}

// TestRunTLSAndRoute: with --ca-file loadgen trusts a broker's private CA
// (without it the same run fails to connect), and --raw-out records each
// request's route from the x-switchyard-route header.
func TestRunTLSAndRoute(t *testing.T) {
	eng, err := simengine.New(simengine.Config{Model: "m", TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	h := eng.Handler()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Switchyard-Route", "pd")
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(dir, "raw.jsonl")
	args := []string{"--url", srv.URL, "--model", "m", "--requests", "3", "--max-tokens", "2", "--json", "--raw-out", raw}

	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append(args, "--ca-file", ca), noenv, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep struct {
		Completed int `json:"completed"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Completed != 3 {
		t.Fatalf("report %s (%v), want 3 completed", stdout.String(), err)
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d raw lines, want 3", len(lines))
	}
	for _, l := range lines {
		var rr struct {
			Route string `json:"route"`
		}
		if err := json.Unmarshal([]byte(l), &rr); err != nil || rr.Route != "pd" {
			t.Errorf("raw line %s: route %q (%v), want pd", l, rr.Route, err)
		}
	}

	stdout.Reset()
	if err := run(context.Background(), args, noenv, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	rep.Completed = -1
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Completed != 0 {
		t.Fatalf("report %s (%v): without --ca-file no request should complete", stdout.String(), err)
	}
}
