package loadgen

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	seq := func(n int) []time.Duration {
		ds := make([]time.Duration, n)
		for i := range ds {
			ds[i] = time.Duration(i+1) * time.Millisecond
		}
		return ds
	}
	// Expected values are numpy.percentile's (linear interpolation).
	for _, tc := range []struct {
		name string
		in   []time.Duration
		p    float64
		want float64 // ms
	}{
		{"one value", []time.Duration{7 * time.Millisecond}, 99, 7},
		{"two values p50", []time.Duration{1 * time.Millisecond, 3 * time.Millisecond}, 50, 2},
		{"1..10 p50", seq(10), 50, 5.5},
		{"1..10 p90", seq(10), 90, 9.1},
		{"1..10 p99", seq(10), 99, 9.91},
		{"1..10 p0", seq(10), 0, 1},
		{"1..10 p100", seq(10), 100, 10},
		{"1..100 p99", seq(100), 99, 99.01},
		{"1..101 p50", seq(101), 50, 51},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Percentile(tc.in, tc.p) / float64(time.Millisecond)
			if math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("p%v = %v ms, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	if s := Summarize(nil); s != (Summary{}) {
		t.Fatalf("empty: %+v", s)
	}
	ds := []time.Duration{4 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	s := Summarize(ds)
	want := Summary{Mean: 2.5, P50: 2.5, P90: 3.7, P99: 3.97}
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"mean", s.Mean, want.Mean}, {"p50", s.P50, want.P50}, {"p90", s.P90, want.P90}, {"p99", s.P99, want.P99}} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestSLOMet(t *testing.T) {
	slo := SLO{TTFT: 100 * time.Millisecond, TPOT: 10 * time.Millisecond}
	for _, tc := range []struct {
		name string
		rec  record
		want bool
	}{
		{"meets both", record{ttft: 50 * time.Millisecond, e2e: 140 * time.Millisecond, outTokens: 10}, true},
		{"slow first token", record{ttft: 150 * time.Millisecond, e2e: 200 * time.Millisecond, outTokens: 10}, false},
		{"slow decode", record{ttft: 50 * time.Millisecond, e2e: 500 * time.Millisecond, outTokens: 10}, false},
		{"one token has no TPOT", record{ttft: 50 * time.Millisecond, e2e: 900 * time.Millisecond, outTokens: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := slo.met(&tc.rec); got != tc.want {
				t.Fatalf("met = %v, want %v", got, tc.want)
			}
		})
	}
}
