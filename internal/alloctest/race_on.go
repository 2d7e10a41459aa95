//go:build race

package alloctest

// Race: built with the race detector, which moves some values to the heap
// and drops a share of what goes into a sync.Pool, so counts differ.
const Race = true
