// Package procs sizes GOMAXPROCS to the load of the process it runs in.
package procs

import (
	"context"
	"math"
	"runtime"
	"runtime/metrics"
	"time"
)

// period is how often Adapt reads the load.
const period = 100 * time.Millisecond

// The rule (next): double the Ps when they were more than upUse busy over
// a period or a goroutine's wait for a P reached upLat at the 99th
// percentile; drop one when the load would fit one fewer at downUse and
// nothing waited.
const (
	upUse   = 0.7
	downUse = 0.5
	upLat   = time.Millisecond
)

// Adapt runs until ctx ends, moving GOMAXPROCS between 1 and max (0: the
// runtime's GOMAXPROCS when Adapt starts) by the CPU the process used in
// each period and how long its goroutines waited for a P, then sets max
// again. It starts at one P.
//
// Why: a relay's goroutines each wake for a short piece of work (a token,
// a message), and with a P idle the runtime wakes another thread for
// nearly every such hand-off and puts it back to sleep. Below a core of
// load one P does the same work for less CPU and, at one stream, sooner;
// above it the Ps double as soon as the load or the wait shows, so a
// busy process has every P it had before.
func Adapt(ctx context.Context, max int) {
	if max <= 0 {
		max = runtime.GOMAXPROCS(0)
	}
	if max <= 1 {
		return
	}
	n := 1
	runtime.GOMAXPROCS(n)
	defer runtime.GOMAXPROCS(max)
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	prevH := cloneHist(s[0].Value.Float64Histogram())
	prevCPU, prevT := cpuTime(), time.Now()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, cpu := time.Now(), cpuTime()
		metrics.Read(s)
		h := s[0].Value.Float64Histogram()
		used := (cpu - prevCPU).Seconds() / now.Sub(prevT).Seconds()
		wait := quantile(prevH, h, 0.99)
		prevCPU, prevT, prevH = cpu, now, cloneHist(h)
		if m := next(n, max, used, wait); m != n {
			n = m
			runtime.GOMAXPROCS(n)
		}
	}
}

// next is the GOMAXPROCS for the coming period, from n, the current one,
// used, the CPU the process used over the last period in cores, and
// wait, the 99th percentile of its goroutines' wait for a P in it.
func next(n, max int, used float64, wait time.Duration) int {
	switch {
	case n < max && (used > upUse*float64(n) || wait > upLat):
		return min(max, 2*n)
	case n > 1 && used < downUse*float64(n-1) && wait < upLat/4:
		return n - 1
	}
	return n
}

func cloneHist(h *metrics.Float64Histogram) *metrics.Float64Histogram {
	return &metrics.Float64Histogram{Counts: append([]uint64(nil), h.Counts...), Buckets: h.Buckets}
}

// quantile is the q quantile of what a cumulative histogram counted
// between two readings of it, as the upper bound of its bucket (the
// lower one for the last, unbounded bucket); 0 if it counted nothing.
func quantile(prev, cur *metrics.Float64Histogram, q float64) time.Duration {
	var total uint64
	for i := range cur.Counts {
		total += cur.Counts[i] - prev.Counts[i]
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var acc uint64
	for i := range cur.Counts {
		acc += cur.Counts[i] - prev.Counts[i]
		if acc >= want {
			b := cur.Buckets[i+1]
			if math.IsInf(b, 1) {
				b = cur.Buckets[i]
			}
			return time.Duration(b * float64(time.Second))
		}
	}
	return 0
}

// Start runs Adapt in a goroutine until ctx ends, unless the GOMAXPROCS
// environment variable (read through getenv) fixes the number of Ps.
func Start(ctx context.Context, getenv func(string) string) {
	if getenv("GOMAXPROCS") == "" {
		go Adapt(ctx, 0)
	}
}
