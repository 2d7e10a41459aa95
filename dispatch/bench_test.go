package dispatch_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

var benchSizes = []int{10, 100, 1000, 10000}

// benchAgents returns n agents, 60% regular, 20% prefill, 20% decode in
// two pairings (vllm, sglang), with mixed load, some ramping or capped by
// their pull limit, and a few warming, draining or stale, so NewModel walks
// every branch.
func benchAgents(n int) []dispatch.Agent {
	rng := rand.New(rand.NewPCG(7, 7))
	as := make([]dispatch.Agent, n)
	for i := range as {
		pool := dispatch.PoolRegular
		switch i % 5 {
		case 3:
			pool = dispatch.PoolPrefill
		case 4:
			pool = dispatch.PoolDecode
		}
		a := ready(fmt.Sprintf("agent-%d", i), pool, 16, rng.IntN(17))
		if pool != dispatch.PoolRegular && i%10 >= 5 {
			a.PDProtocol = "sglang"
		}
		switch i % 20 {
		case 5:
			a.ReadySince = t0.Add(-time.Duration(rng.IntN(30)) * time.Second)
			a.PullLimit = 1 + rng.IntN(16)
		case 7:
			a = warming(a)
			a.StateReason = "engine not healthy yet"
		case 11:
			a.State = dispatch.StateDraining
		case 17:
			a.LastSeen = t0.Add(-10 * time.Second)
		}
		as[i] = a
	}
	return as
}

func BenchmarkDecide(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			m := dispatch.NewModel("m", benchAgents(n), t0, dispatch.DefaultConfig())
			var r uint64
			b.ReportAllocs()
			for b.Loop() {
				r += 0x9e3779b97f4a7c15 // Weyl sequence: uniform enough, free
				if _, err := m.Decide(dispatch.Need{}, nil, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecideInFlight is Decide as the broker calls it, asking what it
// dispatched since the heartbeats (here a map lookup per pool and pairing).
func BenchmarkDecideInFlight(b *testing.B) {
	seen := inflight{
		{dispatch.PoolRegular, ""}:       {pending: 2, active: 30},
		{dispatch.PoolDecode, "vllm"}:    {pending: 1, active: 12},
		{dispatch.PoolPrefill, "sglang"}: {pending: 3},
	}
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			m := dispatch.NewModel("m", benchAgents(n), t0, dispatch.DefaultConfig())
			var r uint64
			b.ReportAllocs()
			for b.Loop() {
				r += 0x9e3779b97f4a7c15
				if _, err := m.Decide(dispatch.Need{}, seen, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkNewModel(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			as := benchAgents(n)
			cfg := dispatch.DefaultConfig()
			b.ReportAllocs()
			for b.Loop() {
				dispatch.NewModel("m", as, t0, cfg)
			}
		})
	}
}

// BenchmarkDecideSLO is the slo decision as the broker makes it: learned
// timing on every agent, a prompt with a cached prefix, targets and what
// the broker dispatched since the heartbeats. threshold is the reference
// decider on the same fleet.
func BenchmarkDecideSLO(b *testing.B) {
	seen := inflight{
		{dispatch.PoolRegular, ""}:       {pending: 2, active: 30},
		{dispatch.PoolDecode, "vllm"}:    {pending: 1, active: 12},
		{dispatch.PoolPrefill, "sglang"}: {pending: 3},
	}
	need := dispatch.Need{
		PromptTokens: 6000,
		Cache:        cache{{dispatch.PoolRegular, ""}: 1024, {dispatch.PoolPrefill, "vllm"}: 4096},
		Targets:      sloTargets,
	}
	for _, mode := range []dispatch.Mode{dispatch.ModeSLO, dispatch.ModeThreshold} {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("mode=%v/agents=%d", mode, n), func(b *testing.B) {
				as := benchAgents(n)
				for i := range as {
					switch as[i].Pool {
					case dispatch.PoolRegular:
						as[i] = timed(as[i], regularTiming)
					case dispatch.PoolPrefill:
						as[i] = timed(as[i], prefillTiming)
					case dispatch.PoolDecode:
						as[i] = timed(as[i], decodeTiming)
					}
				}
				m := dispatch.NewModel("m", as, t0, cfg(mode))
				if d, _ := m.Decide(need, seen, 0); d.Predicted != (mode == dispatch.ModeSLO) {
					b.Fatalf("Decide().Predicted = %v in mode %v", d.Predicted, mode)
				}
				var r uint64
				b.ReportAllocs()
				for b.Loop() {
					r += 0x9e3779b97f4a7c15
					if _, err := m.Decide(need, seen, r); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
