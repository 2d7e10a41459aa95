//go:build !race

// The race detector drops pooled objects at random, so allocation counts
// hold only without it.

package oaiformat

import "testing"

// Reading a token chunk costs the allocation of its text alone.
func TestReadChunkAllocs(t *testing.T) {
	raw := []byte(engineVLLMChunk)
	if _, err := ReadChunk(raw); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = ReadChunk(raw) }); n > 1 {
		t.Fatalf("ReadChunk of a token chunk: %v allocations, want at most 1", n)
	}
}
