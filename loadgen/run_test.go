package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/simengine"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// fakeServer streams a known SSE transcript whose shape the request's
// model selects, and records what it was sent.
type fakeServer struct {
	*httptest.Server
	tokens   int
	itl      time.Duration
	requests atomic.Int64
	inFlight atomic.Int64
	peak     atomic.Int64

	mu     sync.Mutex
	bodies []map[string]any
	auth   []string
}

func newFakeServer(t *testing.T, tokens int, itl time.Duration) *fakeServer {
	f := &fakeServer{tokens: tokens, itl: itl}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.mu.Unlock()
	model, _ := body["model"].(string)
	switch model {
	case "429":
		http.Error(w, `{"error":{"message":"slow down"}}`, http.StatusTooManyRequests)
		return
	case "500":
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
		return
	case "404":
		http.Error(w, `{"error":{"message":"no model"}}`, http.StatusNotFound)
		return
	case "hang":
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(s string) {
		_, _ = io.WriteString(w, s)
		_ = rc.Flush()
	}
	send(`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n")
	for i := range f.tokens {
		if f.itl > 0 && i > 0 {
			time.Sleep(f.itl)
		}
		send(fmt.Sprintf(`data: {"choices":[{"index":0,"delta":{"content":" w%d"}}]}`+"\n\n", i))
		if i == 0 && model == "error-event" {
			send(`data: {"error":{"message":"engine died","code":"internal"}}` + "\n\n")
		}
		if i == 0 && model == "error-type" {
			send("event: error\ndata: {\"message\":\"engine died\"}\n\n")
		}
	}
	if model == "no-done" {
		return
	}
	if model != "no-usage" {
		send(fmt.Sprintf(`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", f.tokens, f.tokens+3))
	}
	send("data: [DONE]\n\n")
}

func TestRunCountsAndStats(t *testing.T) {
	const tokens, itl = 5, 2 * time.Millisecond
	f := newFakeServer(t, tokens, itl)
	cfg := validConfig()
	cfg.URL, cfg.Concurrency, cfg.Requests, cfg.WarmupRequests = f.URL, 4, 20, 3
	cfg.APIKey = "sekret"
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 20 || rep.Completed != 20 || rep.Warmup != 3 || f.requests.Load() != 23 {
		t.Fatalf("requests %d completed %d warm-up %d, server saw %d; want 20, 20, 3, 23",
			rep.Requests, rep.Completed, rep.Warmup, f.requests.Load())
	}
	if rep.OutputTokens != 20*tokens || rep.InputTokens != 20*3 {
		t.Fatalf("tokens out %d in %d, want %d and %d (from usage)", rep.OutputTokens, rep.InputTokens, 20*tokens, 60)
	}
	if p := f.peak.Load(); p > 4 {
		t.Fatalf("%d requests in flight, want at most 4", p)
	}
	// Causal lower bounds only: the server sleeps itl between tokens.
	if min := ms(float64((tokens - 1) * itl)); rep.E2E.P50 < min {
		t.Fatalf("e2e p50 %v ms below the %v ms the server takes", rep.E2E.P50, min)
	}
	// TPOT and ITL have no causal bound (a late first read shortens the
	// gaps after it), so only their plausibility is checked.
	if rep.TPOT.P50 <= 0 || rep.ITL.P50 < 0 || rep.TPOT.P50 > rep.E2E.P50 {
		t.Fatalf("TPOT p50 %v ms, ITL p50 %v ms", rep.TPOT.P50, rep.ITL.P50)
	}
	if rep.TTFT.P50 <= 0 || rep.TTFT.P50 > rep.E2E.P50 || rep.RequestsPerS <= 0 || rep.OutputTokensPerS <= 0 {
		t.Fatalf("implausible report %+v", rep)
	}
	if rep.GoodputPerS != rep.RequestsPerS {
		t.Fatalf("goodput %v without SLOs, want the request rate %v", rep.GoodputPerS, rep.RequestsPerS)
	}
	for _, a := range f.auth {
		if a != "Bearer sekret" {
			t.Fatalf("Authorization %q", a)
		}
	}
}

func TestRunCountsChunksWithoutUsage(t *testing.T) {
	f := newFakeServer(t, 7, 0)
	cfg := validConfig()
	cfg.URL, cfg.Model, cfg.Requests = f.URL, "no-usage", 3
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 3 || rep.OutputTokens != 21 {
		t.Fatalf("completed %d, tokens %d; want 3 and 21 counted chunks", rep.Completed, rep.OutputTokens)
	}
}

func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func TestRunErrorKinds(t *testing.T) {
	f := newFakeServer(t, 3, 0)
	for _, tc := range []struct {
		name, model string
		url         string
		want        ErrorKind
	}{
		{"429", "429", "", KindHTTP429},
		{"500", "500", "", KindHTTP5xx},
		{"404", "404", "", KindHTTP4xx},
		{"error event mid-stream", "error-event", "", KindStreamError},
		{"event: error", "error-type", "", KindStreamError},
		{"no [DONE]", "no-done", "", KindStreamError},
		{"timeout", "hang", "", KindTimeout},
		{"connect", "m", closedPort(t), KindConnect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validConfig()
			cfg.URL, cfg.Model, cfg.Concurrency, cfg.Requests = f.URL, tc.model, 2, 4
			// Only the timeout case is about the timeout: the others must
			// end by their own error, and with a 50ms bound a busy machine
			// turned a slow error event into a timeout.
			cfg.Timeout = 30 * time.Second
			if tc.want == KindTimeout {
				cfg.Timeout = 50 * time.Millisecond
			}
			if tc.url != "" {
				cfg.URL = tc.url
			}
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := map[ErrorKind]int{}
			for _, k := range Kinds {
				want[k] = 0
			}
			want[tc.want] = 4
			if rep.Requests != 4 || rep.Completed != 0 || !mapsEqual(rep.Errors, want) {
				t.Fatalf("requests %d completed %d errors %v; want 4, 0, %v", rep.Requests, rep.Completed, rep.Errors, want)
			}
		})
	}
}

func mapsEqual(a, b map[ErrorKind]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestRunPoisson(t *testing.T) {
	f := newFakeServer(t, 2, 0)
	cfg := validConfig()
	cfg.URL, cfg.Concurrency, cfg.Rate, cfg.Requests, cfg.WarmupRequests, cfg.Seed = f.URL, 3, 400, 40, 5, 7
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 40 || rep.Warmup != 5 || rep.Completed != 40 || f.requests.Load() != 45 {
		t.Fatalf("requests %d warm-up %d completed %d, server saw %d; want 40, 5, 40, 45",
			rep.Requests, rep.Warmup, rep.Completed, f.requests.Load())
	}
	if p := f.peak.Load(); p > 3 {
		t.Fatalf("%d requests in flight above the cap of 3", p)
	}
}

func TestRunPoissonUncapped(t *testing.T) {
	// Without a cap the count holds at a rate the timer resolves and at one
	// far above it, where arrivals are made up in bursts.
	for _, rate := range []float64{50, 1000} {
		f := newFakeServer(t, 1, 0)
		cfg := validConfig()
		cfg.URL, cfg.Concurrency, cfg.Rate, cfg.Duration, cfg.Requests = f.URL, 0, rate, 0, 25
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Requests != 25 {
			t.Fatalf("rate %v: %d requests, want 25", rate, rep.Requests)
		}
	}
}

func TestRunDuration(t *testing.T) {
	f := newFakeServer(t, 2, time.Millisecond)
	cfg := validConfig()
	cfg.URL, cfg.Concurrency, cfg.Requests, cfg.Duration, cfg.WarmupDuration = f.URL, 2, 0, 100*time.Millisecond, 20*time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Issuing stops once 100ms have passed since the first measured send;
	// the last request ends about then (its end is read just before).
	if rep.Requests == 0 || rep.Warmup == 0 || rep.DurationS < 0.09 {
		t.Fatalf("requests %d warm-up %d over %v s; want some of each over about 0.1 s", rep.Requests, rep.Warmup, rep.DurationS)
	}
}

func TestRunPromptsFile(t *testing.T) {
	f := newFakeServer(t, 1, 0)
	ps, err := ReadPrompts(strings.NewReader(`{"prompt":"first one","max_tokens":2}
{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"second"}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg := validConfig()
	cfg.URL, cfg.Requests, cfg.Prompts, cfg.MaxTokens = f.URL, 4, ps, Fixed(9)
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, b := range f.bodies {
		msgs, _ := json.Marshal(b["messages"])
		wantMsgs, wantMax := `[{"content":"first one","role":"user"}]`, 2.0
		if i%2 == 1 {
			wantMsgs, wantMax = `[{"content":"be brief","role":"system"},{"content":"second","role":"user"}]`, 9
		}
		if string(msgs) != wantMsgs || b["max_tokens"] != wantMax {
			t.Fatalf("request %d sent messages %s max_tokens %v; want %s and %v", i, msgs, b["max_tokens"], wantMsgs, wantMax)
		}
		if _, ok := b["ignore_eos"]; ok {
			t.Fatal("ignore_eos sent")
		}
	}
}

func TestRunCancelled(t *testing.T) {
	f := newFakeServer(t, 1, 0)
	cfg := validConfig()
	cfg.URL, cfg.Model, cfg.Concurrency, cfg.Requests, cfg.Timeout = f.URL, "hang", 3, 10, 0
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for f.inFlight.Load() < 3 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	rep, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) || rep == nil {
		t.Fatalf("err = %v, report %v; want the partial report and context.Canceled", err, rep)
	}
	if rep.Requests != 0 || rep.Errors[KindTimeout] != 0 {
		t.Fatalf("cancelled requests counted: %+v", rep)
	}
}

// TestRunSimEngine runs against the repository's simulated engine over
// real HTTP; its TTFT and ITL are causal lower bounds of what is measured.
func TestRunSimEngine(t *testing.T) {
	const ttft, itl = 5 * time.Millisecond, 2 * time.Millisecond
	eng, err := simengine.New(simengine.Config{Model: "m", TTFT: ttft, ITL: itl, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(srv.Close)
	for _, api := range []API{APIChat, APICompletion} {
		t.Run(string(api), func(t *testing.T) {
			cfg := validConfig()
			cfg.URL, cfg.API, cfg.Concurrency, cfg.Requests, cfg.WarmupRequests = srv.URL, api, 8, 40, 8
			cfg.PromptTokens, cfg.MaxTokens = Dist{5, 15}, Fixed(16)
			cfg.SLO = SLO{TTFT: time.Hour}
			var raw bytes.Buffer
			rep, err := Run(context.Background(), cfg, WithRawOut(&raw))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != 40 || rep.Completed != 40 {
				t.Fatalf("requests %d completed %d errors %v", rep.Requests, rep.Completed, rep.Errors)
			}
			if rep.TTFT.P50 < ms(float64(ttft)) {
				t.Fatalf("TTFT p50 %v ms below the engine's %v", rep.TTFT.P50, ttft)
			}
			if rep.TPOT.P50 <= 0 || rep.TPOT.P50 > rep.E2E.P50 {
				t.Fatalf("TPOT p50 %v ms", rep.TPOT.P50)
			}
			if rep.OutputTokens < 40 || rep.OutputTokens > 40*16 {
				t.Fatalf("%d output tokens for 40 requests of at most 16", rep.OutputTokens)
			}
			if rep.GoodputPerS != rep.RequestsPerS {
				t.Fatalf("goodput %v != request rate %v under a 1h TTFT SLO", rep.GoodputPerS, rep.RequestsPerS)
			}
			lines := 0
			sc := bufio.NewScanner(&raw)
			for sc.Scan() {
				var rr RawRecord
				if err := json.Unmarshal(sc.Bytes(), &rr); err != nil {
					t.Fatal(err)
				}
				if rr.Index != lines || rr.Warmup != (lines < 8) || rr.Error != "" || rr.TTFTMS <= 0 || rr.E2EMS < rr.TTFTMS {
					t.Fatalf("raw line %d: %s", lines, sc.Bytes())
				}
				// The engine emits token i at ttft + i*itl after it got the
				// request, which is after it was sent.
				if min := ms(float64(ttft + time.Duration(rr.OutputTokens-1)*itl)); rr.E2EMS < min {
					t.Fatalf("raw line %d: e2e %v ms below the engine's %v ms for %d tokens", lines, rr.E2EMS, min, rr.OutputTokens)
				}
				lines++
			}
			if lines != 48 {
				t.Fatalf("%d raw lines, want 48 (warm-up included)", lines)
			}
		})
	}
}

// TestReportJSONKeys pins the JSON shape scripts depend on.
func TestReportJSONKeys(t *testing.T) {
	f := newFakeServer(t, 2, 0)
	cfg := validConfig()
	cfg.URL, cfg.Requests, cfg.APIKey = f.URL, 2, "sekret"
	cfg.SLO = SLO{TTFT: 200 * time.Millisecond, TPOT: 50 * time.Millisecond}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(keyPaths("", m), "\n") + "\n"
	golden := filepath.Join("testdata", "report_keys.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("report keys changed (run with -update if intended):\n got:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(string(b), "sekret") || strings.Contains(string(b), "api_key") {
		t.Fatal("the API key is echoed")
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"TTFT", "ITL", "TPOT", "E2E", "goodput", "req/s"} {
		if !strings.Contains(table.String(), s) {
			t.Fatalf("table lacks %q:\n%s", s, table.String())
		}
	}
}

func keyPaths(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		p := prefix + k
		out = append(out, p)
		if sub, ok := v.(map[string]any); ok {
			out = append(out, keyPaths(p+".", sub)...)
		}
	}
	slices.Sort(out)
	return out
}
