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

func TestSweepRates(t *testing.T) {
	for _, tt := range []struct {
		name    string
		goodput float64 // rates at or below it are sustained
		want    []float64
	}{
		{"doubles then halves the gap", 37, []float64{16, 32, 64, 48, 40, 36}},
		{"first rate missed", 5, []float64{16, 8, 4, 6}},
		{"stops at half a request", 16.5, []float64{16, 32, 24, 20, 18}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := goodputSweep{start: 16}.begin()
			var got []float64
			for rate, more := 16.0, true; more; {
				got = append(got, rate)
				if len(got) > 20 {
					t.Fatalf("no end: %v", got)
				}
				rate, more = st.next(rate, rate <= tt.goodput)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("rates %v, want %v", got, tt.want)
			}
		})
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
