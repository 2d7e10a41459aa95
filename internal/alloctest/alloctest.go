// Package alloctest counts the allocations a function makes on its own
// goroutine, for tests that hold a path to an allocation budget.
//
// testing.AllocsPerRun counts the whole process's allocations. Beside an
// embedded NATS server and a nats.go connection, that is also what their
// goroutines do while f runs: route f's publishes, read replies, start
// up. How much of it lands in a batch changes with the machine's load: on
// a busy CI machine under -race, AllocsPerRun counted 16 allocations in
// every batch for a job that counts 12 on a quiet one. PerRun counts from
// the memory profile instead, only the allocations whose stack holds f's
// call, so a count is f's whatever else runs.
package alloctest

import (
	"bufio"
	"bytes"
	"math"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
)

// PerRun returns the average number of allocations per call of f made on
// the goroutine that calls it (what f hands to other goroutines is not
// counted), the least of Batches batches of runs calls each, after one
// warm-up call, as testing.AllocsPerRun makes one. The least of a few:
// under the race detector sync.Pool drops a share of what it is given at
// random, and a path that reuses pooled values pays for some again. It
// sets runtime.MemProfileRate to 1 while f runs, so tests that use it
// must not run in parallel with each other.
func PerRun(tb testing.TB, runs int, f func()) float64 {
	tb.Helper()
	// Every allocation is profiled only while f runs: reading the
	// profile allocates too, and would grow it with each read.
	rate := runtime.MemProfileRate
	defer func() { runtime.MemProfileRate = rate }()
	runtime.MemProfileRate = 1
	marked(f)
	least := int64(math.MaxInt64)
	for range Batches {
		runtime.MemProfileRate = rate
		before := markedAllocs(tb)
		runtime.MemProfileRate = 1
		for range runs {
			marked(f)
		}
		runtime.MemProfileRate = rate
		least = min(least, markedAllocs(tb)-before)
	}
	// Whole allocations per run, as AllocsPerRun counts them: a buffer
	// that grows now and then over many runs is not one per run.
	return float64(least / int64(runs))
}

// Batches is how many batches PerRun counts: f runs Batches*runs+1 times.
const Batches = 5

// marked calls f: a frame the memory profile's stacks show.
//
//go:noinline
func marked(f func()) { f() }

// markerFrame is how marked appears in a profile's symbolized stacks.
const markerFrame = "/internal/alloctest.marked+"

// markedAllocs is the number of allocations the memory profile holds with
// marked on their stack. runtime.GC publishes every allocation made
// before it; the text form (debug=1) gives each record's allocation count
// and its whole stack, symbolized, where runtime.MemProfile would cut it
// at 32 frames.
func markedAllocs(tb testing.TB) int64 {
	tb.Helper()
	runtime.GC()
	var buf bytes.Buffer
	if err := pprof.Lookup("allocs").WriteTo(&buf, 1); err != nil {
		tb.Fatal(err)
	}
	var total, record int64
	counted := false
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
			if !counted && strings.Contains(line, markerFrame) {
				total += record
				counted = true
			}
		case strings.Contains(line, " @ "):
			// "inuse objects: inuse bytes [alloc objects: alloc bytes] @ pcs"
			record, counted = 0, false
			open, colon := strings.IndexByte(line, '['), -1
			if open >= 0 {
				colon = strings.IndexByte(line[open:], ':')
			}
			if colon < 0 {
				continue
			}
			n, err := strconv.ParseInt(line[open+1:open+colon], 10, 64)
			if err != nil {
				tb.Fatalf("memory profile line %q: %v", line, err)
			}
			record = n
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return total
}
