//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package wire

import (
	"google.golang.org/protobuf/proto"
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

// A chunk's events are decoded into the Event values an earlier decode
// left in the slice's capacity.
func TestDecodeChunkReusesEvents(t *testing.T) {
	c := reusedChunk(t)
	first := c.Events[0]
	data, err := proto.Marshal(frameChunks()[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := DecodeChunk(data, c); err != nil {
		t.Fatal(err)
	}
	if len(c.Events) != 1 || c.Events[0] != first {
		t.Fatalf("events not reused: %d events, first %p, was %p", len(c.Events), c.Events[0], first)
	}
	if c.Events[0].GetFinishReason() != "" {
		t.Fatalf("a reused event kept its old finish reason %q", c.Events[0].GetFinishReason())
	}
	// The strings alias the data: no copy per chunk.
	if allocs := testing.AllocsPerRun(100, func() { _ = DecodeChunk(data, c) }); allocs != 0 {
		t.Fatalf("DecodeChunk of a token chunk: %.1f allocations, want 0", allocs)
	}
}
