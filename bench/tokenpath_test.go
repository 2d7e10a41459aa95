package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExtraTokenCost(t *testing.T) {
	for _, c := range []struct {
		name                                     string
		shortMS, shortTok, longMS, longTok, want float64
	}{
		// 64-token requests that carried all 64: the old rule's figure.
		{"every token asked for", 0.100, 1, 0.730, 64, 10},
		// The sim-engine ends sequences early: 35.7 tokens a request on
		// average; the extra tokens are 34.7, not 63.
		{"sequences ended early", 0.166, 1, 1.795, 35.7, 1e3 * 1.629 / 34.7},
		{"short row longer than one token", 0.200, 2, 1.200, 12, 100},
	} {
		if got := extraTokenCost(c.shortMS, c.shortTok, c.longMS, c.longTok); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: extraTokenCost = %v µs, want %v", c.name, got, c.want)
		}
	}
	if got := extraTokenCost(0.1, 4, 0.5, 4); !math.IsNaN(got) {
		t.Errorf("same tokens in both rows: got %v, want NaN", got)
	}
}

func TestTokenpathRatios(t *testing.T) {
	got := tokenpathRatios([]ratio{
		{"broker CPU per extra token, against nginx's", "µs", 4.5, 6},
		{"front end CPU per 1-token request, against the Go proxy's", "ms", 0.25, 0.125},
		{"relayed tokens/s at 256 streams, against the Go proxy's", "tokens/s", 45000, 50000},
	})
	want := "| figure | value | peer's value | ratio |\n|---|---|---|---|\n" +
		"| broker CPU per extra token, against nginx's | 4.5 µs | 6.0 µs | 0.75x |\n" +
		"| front end CPU per 1-token request, against the Go proxy's | 0.250 ms | 0.125 ms | 2.00x |\n" +
		"| relayed tokens/s at 256 streams, against the Go proxy's | 45,000 tokens/s | 50,000 tokens/s | 0.90x |\n"
	if got != want {
		t.Errorf("tokenpathRatios:\n%s\nwant:\n%s", got, want)
	}
}

// TestWriteBudget draws the budget's figures: a bar per figure beside its
// peer's, green within the budget and orange outside, the budget's line.
func TestWriteBudget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "img", "budget.svg")
	err := writeBudget(path, "budget", []budgetBar{
		{name: "broker CPU\nper extra token", peer: "nginx", ours: 29.1, theirs: 22.4, budget: 1.25},
		{name: "front end CPU", peer: "the Go proxy", ours: 0.325, theirs: 0.195, budget: 2},
		{name: "tokens/s", peer: "the Go proxy", ours: 30612, theirs: 40229, budget: 0.8, atLeast: true},
		{name: "tokens/s met", peer: "the Go proxy", ours: 36000, theirs: 40000, budget: 0.8, atLeast: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, want := range []string{"1.30x", "1.67x", "0.76x", "0.90x", "≤ 1.25x", "≥ 0.8x", "per extra token", "against nginx", "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the plot lacks %q", want)
		}
	}
	if got := strings.Count(svg, `fill="#d95f02"`); got != 2 {
		t.Errorf("%d bars outside the budget, want 2 (the broker's and the relay's)", got)
	}
	if got := strings.Count(svg, `fill="#1b9e77"`); got != 2 {
		t.Errorf("%d bars within the budget, want 2", got)
	}
	if err := writeBudget(path, "budget", []budgetBar{{name: "x", ours: 1}}); err == nil {
		t.Error("a figure without its peer's value was drawn")
	}
}
