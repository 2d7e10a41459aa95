//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package affinity

import (
	"fmt"
	"testing"
)

func TestChooseAllocs(t *testing.T) {
	cands := make([]Candidate, 16)
	for i := range cands {
		cands[i] = Candidate{FreeSlots: i % 3, Load: i, Matched: i % 5}
	}
	g := DefaultGuard()
	if n := testing.AllocsPerRun(100, func() { _ = Choose(cands, g) }); n != 0 {
		t.Errorf("Choose allocates %v times", n)
	}
}

func TestTreeMatchAllocs(t *testing.T) {
	tr := NewTree(TreeConfig{})
	p := prompt("s", 8, 24, "c")
	for i := range 8 {
		tr.Insert(fmt.Sprintf("agent-%d", i), p[:4*(i+1)])
	}
	dst := make([]Match, 0, 16)
	if n := testing.AllocsPerRun(100, func() { dst = tr.Match(p, dst) }); n != 0 {
		t.Errorf("Match allocates %v times", n)
	}
	if m := matches(dst); m["agent-7"] != 32 || m["agent-0"] != 4 {
		t.Errorf("Match = %v", m)
	}
	if n := testing.AllocsPerRun(100, func() { tr.Insert("agent-3", p) }); n != 0 {
		t.Errorf("Insert of known blocks allocates %v times", n)
	}
}

func TestAppendKeysAllocs(t *testing.T) {
	text := words(500, "z")
	dst := make([]uint64, 0, 64)
	if n := testing.AllocsPerRun(100, func() { dst = AppendKeys(dst[:0], 16, text) }); n != 0 {
		t.Errorf("AppendKeys allocates %v times", n)
	}
}
