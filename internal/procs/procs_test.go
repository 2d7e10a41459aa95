package procs

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

func TestNext(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		n, max int
		used   float64
		wait   time.Duration
		want   int
	}{
		{1, 8, 0.1, 0, 1},                       // light: one P
		{1, 8, 0.69, 500 * time.Microsecond, 1}, // under both marks
		{1, 8, 0.75, 0, 2},                      // busy
		{1, 8, 0.3, 2 * ms, 2},                  // goroutines waited for the P
		{2, 8, 1.5, 0, 4},                       // doubles
		{4, 6, 3.5, 0, 6},                       // not past max
		{6, 6, 6, 5 * ms, 6},                    // at max
		{2, 8, 0.6, 0, 2},                       // 0.6 would not fit one P at half load
		{2, 8, 0.4, 0, 1},                       // it fits
		{2, 8, 0.4, 300 * time.Microsecond, 2},  // but goroutines still wait
		{4, 8, 1.4, 0, 3},                       // one fewer at a time
		{1, 1, 5, 5 * ms, 1},                    // max 1
	} {
		if got := next(tc.n, tc.max, tc.used, tc.wait); got != tc.want {
			t.Errorf("next(%d, %d, %.2f, %v) = %d, want %d", tc.n, tc.max, tc.used, tc.wait, got, tc.want)
		}
	}
}

func TestQuantile(t *testing.T) {
	buckets := []float64{0, 1e-6, 1e-3, 1e-2, 1}
	hist := func(c ...uint64) *metrics.Float64Histogram {
		return &metrics.Float64Histogram{Counts: c, Buckets: buckets}
	}
	prev := hist(5, 5, 5, 5)
	for _, tc := range []struct {
		cur  *metrics.Float64Histogram
		q    float64
		want time.Duration
	}{
		{hist(5, 5, 5, 5), 0.99, 0},                  // nothing new
		{hist(105, 5, 5, 5), 0.99, time.Microsecond}, // all in the first bucket
		{hist(104, 5, 5, 6), 0.99, time.Microsecond}, // 1 of 100 in the last: not the 99th
		{hist(103, 5, 5, 7), 0.99, time.Second},      // 2 of 100 are
		{hist(103, 5, 5, 7), 0.98, time.Microsecond},
		{hist(5, 5, 15, 5), 0.5, 10 * time.Millisecond},
	} {
		if got := quantile(prev, tc.cur, tc.q); got != tc.want {
			t.Errorf("quantile(%v, %.2f) = %v, want %v", tc.cur.Counts, tc.q, got, tc.want)
		}
	}
	// The last bucket is unbounded: its lower bound.
	inf := &metrics.Float64Histogram{Counts: []uint64{0, 1}, Buckets: []float64{0, 2, math.Inf(1)}}
	if got := quantile(&metrics.Float64Histogram{Counts: []uint64{0, 0}, Buckets: inf.Buckets}, inf, 0.99); got != 2*time.Second {
		t.Errorf("unbounded bucket: %v, want 2s", got)
	}
}

// TestAdapt runs Adapt on this process: one P while it idles, more while
// goroutines keep two Ps' worth of CPU busy, one again after, max once
// it ends.
func TestAdapt(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(old)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Adapt(ctx, 4); close(done) }()
	procs := func(want func(int) bool, what string) {
		t.Helper()
		testwait.For(t, 20*time.Second, 10*time.Millisecond, func() error {
			if n := runtime.GOMAXPROCS(0); !want(n) {
				return fmt.Errorf("GOMAXPROCS %d, want %s", n, what)
			}
			return nil
		})
	}
	procs(func(n int) bool { return n == 1 }, "1 while idle")
	var stop atomic.Bool
	var spin sync.WaitGroup
	for range 2 {
		spin.Go(func() {
			for !stop.Load() {
				for range 1000 {
					runtime.Gosched()
				}
			}
		})
	}
	procs(func(n int) bool { return n >= 2 }, "2 or more while busy")
	stop.Store(true)
	spin.Wait()
	procs(func(n int) bool { return n == 1 }, "1 once idle again")
	cancel()
	<-done
	if n := runtime.GOMAXPROCS(0); n != 4 {
		t.Fatalf("GOMAXPROCS %d after Adapt ended, want its max, 4", n)
	}
}
