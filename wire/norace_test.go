//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package wire

import (
	"testing"
)

// Framing a token chunk into a reused buffer allocates nothing: it runs
// for every token an agent relays.
func TestAppendFrameAllocs(t *testing.T) {
	c := frameChunks()[1]
	buf := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if buf, err = AppendFrame(append(buf[:0], FrameMarker), c); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendFrame: %.0f allocations per chunk, want 0", allocs)
	}
	allocs = testing.AllocsPerRun(100, func() {
		_ = Frames(buf, func([]byte) error { return nil })
	})
	if allocs != 0 {
		t.Fatalf("Frames: %.0f allocations per message, want 0", allocs)
	}
}

// TestAppendChunkGrowsOnce: into an empty buffer (an agent's first chunk of
// a job) the encoding takes one allocation, not one per growth.
func TestAppendChunkGrowsOnce(t *testing.T) {
	for i, c := range encodeChunks() {
		if c.Error != nil {
			continue // proto's
		}
		if allocs := testing.AllocsPerRun(100, func() { _, _ = AppendChunk(nil, c) }); allocs > 1 {
			t.Fatalf("chunk %d: %.0f allocations, want at most 1", i, allocs)
		}
	}
}
