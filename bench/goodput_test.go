package main

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestGridSweepRates(t *testing.T) {
	for _, tt := range []struct {
		name    string
		goodput float64 // rates at or below it are sustained
		most    int
		want    []float64
		got     float64
	}{
		{"up until a miss", 30, 4, []float64{20, 24, 29, 35}, 29},
		{"down until sustained", 15, 4, []float64{20, 16.5, 14}, 14},
		{"at most most rates", 100, 3, []float64{20, 24, 29}, 29},
		{"never sustained", 1, 3, []float64{20, 16.5, 14}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []float64
			r, err := gridSweep{step: 1.2}.run(20, tt.most, func(rate float64) (goodputPoint, error) {
				got = append(got, rate)
				p := goodputPoint{rate: rate, sent: 10}
				if rate <= tt.goodput {
					p.good = 10
				}
				return p, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) || r.goodput != tt.got {
				t.Fatalf("rates %v goodput %g, want %v %g", got, r.goodput, tt.want, tt.got)
			}
		})
	}
}

func TestGridWorkloads(t *testing.T) {
	// Replayed: every window starts the same list from its first prompt.
	a, b := newGridWorkload("replayed", 1, 7), newGridWorkload("replayed", 1, 9)
	for range 5 {
		if x, y := a.next(), b.next(); x.prompt != y.prompt {
			t.Fatal("replayed windows differ")
		}
	}
	// Distinct: no prompt repeats across windows.
	if newGridWorkload("distinct", 1, 7).next().prompt == newGridWorkload("distinct", 1, 9).next().prompt {
		t.Fatal("distinct prompts repeat")
	}
	// Multi-turn: a later turn re-sends its conversation's earlier turns.
	m := newGridWorkload("multiturn", 1, 7)
	firsts := map[string]bool{}
	shared := 0
	for range 200 {
		r := m.next()
		if len(r.history) == 0 {
			firsts[r.prompt] = true
			continue
		}
		if len(r.history)%2 != 0 || !firsts[r.history[0]] {
			t.Fatalf("a turn with %d earlier turns not from a conversation's first", len(r.history))
		}
		shared++
	}
	if shared < 100 {
		t.Fatalf("%d of 200 requests continue a conversation", shared)
	}
	body, err := goodputReq{history: []string{"q", "a"}, prompt: "q2", maxTokens: 3}.body()
	if err != nil || !strings.Contains(string(body), `"role":"assistant","content":"a"`) {
		t.Fatalf("body %s: %v", body, err)
	}
}

// TestGoodputRequestScores runs the scorer against an SSE server whose
// first token and gaps are set per case.
func TestGoodputRequestScores(t *testing.T) {
	chunk := func(w http.ResponseWriter, s string) {
		fmt.Fprintf(w, "data: %s\n\n", s)
		w.(http.Flusher).Flush()
	}
	for _, tt := range []struct {
		name        string
		first, gap  time.Duration
		tokens      int
		status      int
		errorEvent  bool
		met, failed bool
	}{
		{name: "met", tokens: 5, met: true}, // no delay: a busy machine adds its own
		{name: "slow first token", first: goodTTFT + 100*time.Millisecond, gap: time.Millisecond, tokens: 3},
		{name: "slow tokens", first: 0, gap: goodTPOT + 15*time.Millisecond, tokens: 4},
		{name: "error status", status: http.StatusServiceUnavailable, failed: true},
		{name: "error event", tokens: 2, errorEvent: true, failed: true},
		{name: "no tokens", failed: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.status != 0 {
					http.Error(w, `{"error":{"message":"busy"}}`, tt.status)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				chunk(w, `{"choices":[{"delta":{"role":"assistant","content":""}}]}`)
				time.Sleep(tt.first)
				for i := range tt.tokens {
					if i > 0 {
						time.Sleep(tt.gap)
					}
					chunk(w, `{"choices":[{"delta":{"content":"tok"}}]}`)
				}
				if tt.errorEvent {
					chunk(w, `{"error":{"message":"engine failed","code":"engine_error"}}`)
				}
				chunk(w, "[DONE]")
			}))
			defer srv.Close()
			met, failed := goodputRequest(t.Context(), srv.Client(), srv.URL, goodputReq{prompt: "hello", maxTokens: 8})
			if met != tt.met || failed != tt.failed {
				t.Fatalf("met %v failed %v, want %v %v", met, failed, tt.met, tt.failed)
			}
		})
	}
}

func TestLineChartDraws(t *testing.T) {
	path := filepath.Join(t.TempDir(), "img", "chart.svg")
	err := lineChart{title: "goodput", xLabel: "fleet", yLabel: "req/s", labels: []string{"8 regular", "4+2P+2D", "0+4P+4D"}, guide: 20}.
		write(path, []curve{{name: "slo", x: []float64{0, 1, 2}, y: []float64{30, 32, 28}}, {name: "capacity", x: []float64{0, 1, 2}, y: []float64{30, 24, 28}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Lines  []struct{} `xml:"polyline"`
		Points []struct{} `xml:"circle"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	if len(doc.Lines) != 2 || len(doc.Points) != 6 || !strings.Contains(string(b), "4+2P+2D") {
		t.Fatalf("%d lines, %d points; want 2 and 6 and the labels:\n%s", len(doc.Lines), len(doc.Points), b)
	}
	if err := (lineChart{title: "empty"}).write(path, nil); err == nil {
		t.Fatal("a chart without data was drawn")
	}
}

func TestMachineCPU(t *testing.T) {
	busy, all := machineCPU()
	if all <= 0 || busy < 0 || busy > all {
		t.Fatalf("busy %d of %d ticks", busy, all)
	}
}
