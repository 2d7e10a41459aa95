package affinity

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
)

// prompt returns the keys of a prompt sharing its first shared blocks with
// every prompt of the same group.
func prompt(group string, shared, own int, id string) []uint64 {
	var ks []uint64
	h := NewHasher(4)
	for i := range shared {
		_, _ = h.WriteString(fmt.Sprintf(" %s%d a b c", group, i))
	}
	for i := range own {
		_, _ = h.WriteString(fmt.Sprintf(" %s%d x y z", id, i))
	}
	ks = append(ks, h.Keys()...)
	return ks
}

func matches(ms []Match) map[string]int {
	m := make(map[string]int, len(ms))
	for _, x := range ms {
		m[x.Agent] = x.Blocks
	}
	return m
}

func TestTreeInsertMatch(t *testing.T) {
	tr := NewTree(TreeConfig{})
	conv := prompt("sys", 4, 4, "c1")
	tr.Insert("a", conv[:6])
	tr.Insert("b", conv[:3])
	other := prompt("sys", 4, 4, "c2")
	tests := []struct {
		name string
		keys []uint64
		want map[string]int
	}{
		{name: "longest prefix per agent", keys: conv, want: map[string]int{"a": 6, "b": 3}},
		{name: "shared system prompt only", keys: other, want: map[string]int{"a": 4, "b": 3}},
		{name: "unknown prompt", keys: prompt("zzz", 2, 0, ""), want: map[string]int{}},
		{name: "no keys", keys: nil, want: map[string]int{}},
		{name: "first block differs", keys: prompt("sys2", 4, 4, "c1"), want: map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := matches(tr.Match(tt.keys, nil))
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Match = %v, want %v", got, tt.want)
			}
		})
	}
	// Inserting again is idempotent.
	tr.Insert("a", conv[:6])
	if st := tr.Stats(); st.Blocks != 9 || st.Agents != 2 {
		t.Errorf("Stats = %+v, want 9 blocks of 2 agents", st)
	}
}

func TestTreeEvictsLeastRecentlyUsedTailFirst(t *testing.T) {
	tr := NewTree(TreeConfig{MaxBlocks: 10})
	p1 := prompt("p1", 6, 0, "")
	p2 := prompt("p2", 6, 0, "")
	tr.Insert("a", p1)
	tr.Insert("a", p2) // 12 entries into 10: p1's last two blocks go
	if st := tr.Stats(); st.Blocks != 10 || st.Evicted != 2 {
		t.Fatalf("Stats = %+v, want 10 blocks, 2 evicted", st)
	}
	if got := matches(tr.Match(p1, nil)); got["a"] != 4 {
		t.Errorf("p1 match = %v, want a:4 (its tail evicted first)", got)
	}
	if got := matches(tr.Match(p2, nil)); got["a"] != 6 {
		t.Errorf("p2 match = %v, want a:6", got)
	}
	// Touching p1 makes p2 the older one.
	tr.Insert("a", p1[:4])
	tr.Insert("b", p1[:3])
	if got := matches(tr.Match(p2, nil)); got["a"] != 3 {
		t.Errorf("p2 match after touching p1 = %v, want a:3", got)
	}
	if got := matches(tr.Match(p1, nil)); got["a"] != 4 || got["b"] != 3 {
		t.Errorf("p1 match = %v, want a:4 b:3", got)
	}
}

func TestTreeBoundedMemory(t *testing.T) {
	const max = 500
	tr := NewTree(TreeConfig{MaxBlocks: max})
	for i := range 200 {
		tr.Insert(fmt.Sprintf("agent-%d", i%7), prompt(fmt.Sprintf("g%d", i%13), 5, 10, fmt.Sprintf("c%d", i)))
		if st := tr.Stats(); st.Blocks > max {
			t.Fatalf("after %d inserts: %d blocks > %d", i, st.Blocks, max)
		}
	}
	st := tr.Stats()
	if st.Blocks != max || st.Keys > max {
		t.Errorf("Stats = %+v, want %d blocks", st, max)
	}
	if len(tr.slab) > max+1 || len(tr.ents) != max {
		t.Errorf("slab grew to %d entries, index %d, bound %d", len(tr.slab), len(tr.ents), max)
	}
	sum := 0
	for i := range 7 {
		sum += tr.AgentBlocks(fmt.Sprintf("agent-%d", i))
	}
	if sum != max {
		t.Errorf("agents hold %d blocks, tree %d", sum, max)
	}
}

func TestTreeRemoveAgent(t *testing.T) {
	tr := NewTree(TreeConfig{MaxBlocks: 100})
	p := prompt("s", 3, 3, "c")
	tr.Insert("a", p)
	tr.Insert("b", p)
	tr.Insert("c", p[:2])
	tr.RemoveAgent("b")
	tr.RemoveAgent("nobody")
	if got := matches(tr.Match(p, nil)); fmt.Sprint(got) != fmt.Sprint(map[string]int{"a": 6, "c": 2}) {
		t.Errorf("Match = %v, want a:6 c:2", got)
	}
	if st := tr.Stats(); st.Blocks != 8 || st.Agents != 2 {
		t.Errorf("Stats = %+v", st)
	}
	// The id is reused by a new agent, which starts empty.
	tr.Insert("d", p[:1])
	if got := matches(tr.Match(p, nil)); got["d"] != 1 || got["b"] != 0 {
		t.Errorf("Match = %v, want d:1 and no b", got)
	}
	tr.RemoveAgent("a")
	tr.RemoveAgent("c")
	tr.RemoveAgent("d")
	if st := tr.Stats(); st.Blocks != 0 || st.Keys != 0 || st.Agents != 0 {
		t.Errorf("empty tree Stats = %+v", st)
	}
}

func TestTreePreciseOverApproximate(t *testing.T) {
	tr := NewTree(TreeConfig{})
	p := prompt("s", 4, 4, "c")
	tr.Insert("a", p)     // the broker sent it p
	tr.Insert("b", p)     // and to b
	tr.Stored("b", p[:5]) // b's engine says it holds 5 blocks
	got := tr.Match(p, nil)
	sort.Slice(got, func(i, j int) bool { return got[i].Agent < got[j].Agent })
	if len(got) != 2 || got[0].Blocks != 8 || got[0].Precise || got[1].Blocks != 5 || !got[1].Precise {
		t.Fatalf("Match = %+v, want a:8 approximate, b:5 precise", got)
	}
	// b's engine evicts block 2: b's prefix stops at 2, though the broker
	// sent it the whole prompt.
	tr.Removed("b", p[2:3])
	if m := matches(tr.Match(p, nil)); m["b"] != 2 {
		t.Errorf("after eviction b = %d, want 2", m["b"])
	}
	// Approximate inserts do not resurrect a precise agent's blocks.
	tr.Insert("b", p)
	if m := matches(tr.Match(p, nil)); m["b"] != 2 {
		t.Errorf("after insert b = %d, want 2", m["b"])
	}
	tr.Cleared("b")
	if m := matches(tr.Match(p, nil)); m["b"] != 0 || m["a"] != 8 {
		t.Errorf("after clear = %v, want a:8 only", m)
	}
	// Losing the event stream falls back to what the broker sent.
	tr.ForgetPrecise("b")
	if got := tr.Match(p, nil); len(got) != 2 || slices.ContainsFunc(got, func(m Match) bool { return m.Precise || m.Blocks != 8 }) {
		t.Errorf("after ForgetPrecise = %+v, want both 8 approximate", got)
	}
	// Stored for a prompt the broker never sent (another broker did).
	q := prompt("q", 3, 0, "")
	tr.Stored("c", q)
	if m := matches(tr.Match(q, nil)); m["c"] != 3 {
		t.Errorf("precise only = %v, want c:3", m)
	}
	tr.Removed("c", q)
	if st := tr.Stats(); st.Blocks != 16 {
		t.Errorf("Stats = %+v, want 16 blocks (a and b, 8 each)", st)
	}
}

func TestTreeConcurrent(t *testing.T) {
	tr := NewTree(TreeConfig{MaxBlocks: 300})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			var dst []Match
			for i := range 300 {
				p := prompt(fmt.Sprintf("g%d", i%5), 4, 4, fmt.Sprintf("w%dc%d", w, i))
				a := fmt.Sprintf("agent-%d", (i+w)%6)
				switch i % 10 {
				case 7:
					tr.Stored(a, p[:3])
				case 8:
					tr.Removed(a, p[1:2])
				case 9:
					tr.RemoveAgent(a)
				default:
					tr.Insert(a, p)
				}
				dst = tr.Match(p, dst)
			}
		})
	}
	wg.Wait()
	if st := tr.Stats(); st.Blocks > 300 {
		t.Errorf("Stats = %+v over the bound", st)
	}
}

func TestTreeManyAgents(t *testing.T) {
	tr := NewTree(TreeConfig{})
	p := prompt("s", 2, 2, "c")
	// Agents past 64 widen the masks; what was known stays known.
	for i := range MaxAgents + 10 {
		tr.Insert(fmt.Sprintf("agent-%03d", i), p[:1+i%4])
	}
	got := matches(tr.Match(p, nil))
	if len(got) != MaxAgents {
		t.Fatalf("%d agents matched, want %d (the rest beyond MaxAgents)", len(got), MaxAgents)
	}
	for i := range MaxAgents {
		if n := got[fmt.Sprintf("agent-%03d", i)]; n != 1+i%4 {
			t.Fatalf("agent-%03d matched %d, want %d", i, n, 1+i%4)
		}
	}
	// A freed id makes room for a newcomer.
	tr.RemoveAgent("agent-070")
	tr.Insert("late", p)
	if m := matches(tr.Match(p, nil)); m["late"] != 4 || m["agent-070"] != 0 {
		t.Errorf("late = %d, agent-070 = %d", m["late"], m["agent-070"])
	}
}

func TestTreeBlend(t *testing.T) {
	tr := NewTree(TreeConfig{Blend: true})
	p := prompt("s", 4, 4, "c")
	tr.Stored("b", p[:2]) // b reports events; its engine holds 2 blocks
	tr.Insert("b", p)     // and the broker just sent it the whole prompt
	if m := matches(tr.Match(p, nil)); m["b"] != 8 {
		t.Fatalf("blend: b = %d, want 8 (what was just sent counts at once)", m["b"])
	}
	tr.Removed("b", p[3:4]) // the engine evicts block 3: gone from both sources
	if m := matches(tr.Match(p, nil)); m["b"] != 3 {
		t.Fatalf("after eviction b = %d, want 3", m["b"])
	}
	tr.Cleared("b")
	if m := matches(tr.Match(p, nil)); m["b"] != 0 {
		t.Fatalf("after clear b = %d, want 0", m["b"])
	}
	if st := tr.Stats(); st.Blocks != 0 {
		t.Fatalf("after clear %d entries left", st.Blocks)
	}
}

// TestTreeForget: a request that failed on its agent before its engine
// computed the prompt is forgotten there, except the blocks another
// request sent since (a shared system prompt) and what the engine itself
// reported.
func TestTreeForget(t *testing.T) {
	tests := []struct {
		name string
		run  func(tr *Tree, failed []uint64, n uint32)
		want map[string]int // Match of the failed prompt afterwards
	}{
		{"alone", func(tr *Tree, failed []uint64, n uint32) {
			tr.Forget("a", failed, n)
		}, map[string]int{}},
		{"shared prefix sent since", func(tr *Tree, failed []uint64, n uint32) {
			tr.Insert("a", prompt("sys", 4, 2, "other"))
			tr.Forget("a", failed, n)
		}, map[string]int{"a": 4}},
		{"same prompt sent again since", func(tr *Tree, failed []uint64, n uint32) {
			tr.Insert("a", failed)
			tr.Forget("a", failed, n)
		}, map[string]int{"a": 8}},
		{"sent before", func(tr *Tree, failed []uint64, n uint32) {
			tr.Forget("a", failed, n)
		}, map[string]int{"a": 8}},
		{"engine stored it", func(tr *Tree, failed []uint64, n uint32) {
			tr.Stored("a", failed[:3])
			tr.Forget("a", failed, n)
		}, map[string]int{"a": 3}},
		{"other agent untouched", func(tr *Tree, failed []uint64, n uint32) {
			tr.Insert("b", failed)
			tr.Forget("a", failed, n)
		}, map[string]int{"b": 8}},
		{"unknown insert", func(tr *Tree, failed []uint64, n uint32) {
			tr.Forget("a", failed, 0)
			tr.Forget("a", failed, n+100)
			tr.Forget("nobody", failed, n)
		}, map[string]int{"a": 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTree(TreeConfig{Blend: true})
			failed := prompt("sys", 4, 4, "c1")
			if tt.name == "sent before" {
				tr.Insert("a", failed) // an older request's, which may have cached it
			}
			n := tr.Insert("a", failed)
			if n == 0 {
				t.Fatal("Insert returned no number")
			}
			tt.run(tr, failed, n)
			if got := matches(tr.Match(failed, nil)); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Match = %v, want %v", got, tt.want)
			}
		})
	}
}
