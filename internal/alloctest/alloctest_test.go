package alloctest

import (
	"runtime"
	"sync/atomic"
	"testing"
)

var sink atomic.Pointer[[64]byte]

// allocate makes n heap objects of its own.
//
//go:noinline
func allocate(n int) {
	for range n {
		sink.Store(new([64]byte))
	}
}

// In a quiet process PerRun counts what testing.AllocsPerRun does.
func TestPerRunAgreesWithAllocsPerRun(t *testing.T) {
	for _, n := range []int{0, 1, 3, 7} {
		f := func() { allocate(n) }
		if got, want := PerRun(t, 100, f), testing.AllocsPerRun(100, f); got != want {
			t.Errorf("f making %d objects a run: counted %.2f, AllocsPerRun %.2f", n, got, want)
		}
	}
}

func TestPerRunCountsOnlyItsGoroutine(t *testing.T) {
	// Another goroutine allocating all the while on another P, as an
	// embedded server routes messages, is not f's. (AllocsPerRun runs
	// with GOMAXPROCS 1, which keeps such a loop out of most batches but
	// not a server's reply to f, or its start-up under load.)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				allocate(10)
				runtime.Gosched()
			}
		}
	}()
	defer func() { close(stop); <-done }()

	rate := runtime.MemProfileRate
	for _, want := range []int{0, 1, 3, 7} {
		got := PerRun(t, 100, func() { allocate(want) })
		if got != float64(want) {
			t.Errorf("f making %d objects a run: counted %.2f", want, got)
		}
	}
	if runtime.MemProfileRate != rate {
		t.Errorf("MemProfileRate left at %d, was %d", runtime.MemProfileRate, rate)
	}
	// What f hands to another goroutine is not counted either.
	got := PerRun(t, 20, func() {
		ch := make(chan struct{}) // f's own: one allocation
		go func() { allocate(5); close(ch) }()
		<-ch
	})
	if got > 2 { // the channel and the goroutine's closure
		t.Errorf("f handing its allocations off: counted %.2f", got)
	}
}

// Allocations made now and then, fewer than one a run, count as none, as
// testing.AllocsPerRun counts them.
func TestPerRunCountsWhole(t *testing.T) {
	n := 0
	got := PerRun(t, 100, func() {
		n++
		if n%2 == 0 {
			allocate(1)
		}
	})
	if got != 0 {
		t.Fatalf("one allocation every other run: counted %.2f, want 0", got)
	}
}
