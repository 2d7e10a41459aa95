//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package oaiformat

import (
	"testing"
)

func TestRewriteAllocs(t *testing.T) {
	body := []byte(benchBody)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := StreamingBody(body); err != nil {
			t.Fatal(err)
		}
	}); n > 1 {
		t.Errorf("StreamingBody: %v allocations, want at most 1", n)
	}
}
