package main

import (
	"math"
	"testing"
)

func TestHistQuantile(t *testing.T) {
	inf := math.Inf(1)
	h := hist{le: []float64{.001, .002, .005, inf}, count: []float64{50, 90, 100, 100}}
	for _, c := range []struct{ q, want float64 }{
		{.5, .001},   // the 50th of 100 is the first bucket's last
		{.25, .0005}, // halfway into the first bucket
		{.7, .0015},  // halfway into the second
		{.95, .0035}, // halfway into the third
		{1, .005},    // nothing beyond the third
	} {
		if got := h.quantile(c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	d := h.sub(hist{le: h.le, count: []float64{50, 50, 50, 50}})
	if got := d.quantile(.5); math.Abs(got-.001625) > 1e-12 {
		t.Errorf("difference: quantile(.5) = %v, want .001625 (the 25th of 50 new ones, 40 of them in the second bucket)", got)
	}
	if got := (hist{le: h.le, count: make([]float64, 4)}).quantile(.5); !math.IsNaN(got) {
		t.Errorf("empty: quantile = %v, want NaN", got)
	}
	beyond := hist{le: []float64{.001, inf}, count: []float64{1, 10}}
	if got := beyond.quantile(.99); got != .001 {
		t.Errorf("in +Inf: quantile = %v, want the last finite bound", got)
	}
}
