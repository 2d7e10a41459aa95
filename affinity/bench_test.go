package affinity

import (
	"fmt"
	"strings"
	"testing"
)

// benchPrompts returns n conversations of blocks blocks each, groups of 8
// sharing their first half (a system prompt).
func benchPrompts(n, blocks int) [][]uint64 {
	ps := make([][]uint64, n)
	for i := range ps {
		ps[i] = prompt(fmt.Sprintf("g%d", i/8), blocks/2, blocks-blocks/2, fmt.Sprintf("c%d", i))
	}
	return ps
}

func BenchmarkKeys(b *testing.B) {
	for _, n := range []int{1 << 10, 16 << 10} {
		b.Run(fmt.Sprintf("bytes=%d", n), func(b *testing.B) {
			text := strings.Repeat("the quick brown fox jumps over it ", n/34+1)[:n]
			dst := make([]uint64, 0, n/16)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				dst = AppendKeys(dst[:0], DefaultBlockSize, text)
			}
		})
	}
}

func BenchmarkTreeInsert(b *testing.B) {
	for _, agents := range []int{4, 32} {
		b.Run(fmt.Sprintf("agents=%d", agents), func(b *testing.B) {
			tr := NewTree(TreeConfig{MaxBlocks: 1 << 16})
			ps := benchPrompts(4096, 32) // 128k blocks into 64k: evicts
			names := make([]string, agents)
			for i := range names {
				names[i] = fmt.Sprintf("agent-%d", i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tr.Insert(names[i%agents], ps[i%len(ps)])
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/32, "ns/block")
		})
	}
}

func BenchmarkTreeMatch(b *testing.B) {
	for _, agents := range []int{4, 32} {
		b.Run(fmt.Sprintf("agents=%d", agents), func(b *testing.B) {
			tr := NewTree(TreeConfig{MaxBlocks: 1 << 18})
			ps := benchPrompts(1024, 64)
			for i, p := range ps {
				// Each conversation on a few agents; the system prompts on all.
				for k := range 3 {
					tr.Insert(fmt.Sprintf("agent-%d", (i+k*7)%agents), p)
				}
			}
			dst := make([]Match, 0, agents)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				dst = tr.Match(ps[i%len(ps)], dst)
				i++
			}
		})
	}
}

func BenchmarkTreeMatchParallel(b *testing.B) {
	tr := NewTree(TreeConfig{MaxBlocks: 1 << 18})
	ps := benchPrompts(1024, 64)
	for i, p := range ps {
		tr.Insert(fmt.Sprintf("agent-%d", i%8), p)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]Match, 0, 8)
		i := 0
		for pb.Next() {
			dst = tr.Match(ps[i%len(ps)], dst)
			i++
		}
	})
}

func BenchmarkChoose(b *testing.B) {
	for _, agents := range []int{4, 32} {
		b.Run(fmt.Sprintf("agents=%d", agents), func(b *testing.B) {
			cands := make([]Candidate, agents)
			for i := range cands {
				cands[i] = Candidate{FreeSlots: i % 3, Load: i % 5, Matched: i % 7}
			}
			g := DefaultGuard()
			b.ReportAllocs()
			for b.Loop() {
				_ = Choose(cands, g)
			}
		})
	}
}
