//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package dispatch_test

import (
	"github.com/switchyard-ai/switchyard/dispatch"
	"math"
	"slices"
	"testing"
	"time"
)

func TestFleet(t *testing.T) {
	stale := ready("old", dispatch.PoolRegular, 8, 0)
	stale.LastSeen = t0.Add(-time.Minute)
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	f := dispatch.NewFleet(map[string][]dispatch.Agent{
		"zeta/b":   pools(1, 0, 0, 8),
		"alpha/a":  pools(0, 1, 1, 8), // PD only
		"prefill":  pools(0, 1, 0, 8), // no partner: nothing to serve with
		"mismatch": {ready("p", P, 8, 0), sglang(ready("d", D, 8, 0))},
		"loading":  {warming(ready("r", R, 8, 0)), warming(ready("p", P, 8, 0)), warming(ready("d", D, 8, 0))},
		"gone":     {stale},
		"empty":    nil,
	}, t0, dispatch.DefaultConfig())

	if got, want := f.Models(), []string{"alpha/a", "zeta/b"}; !slices.Equal(got, want) {
		t.Errorf("Models() = %v, want %v", got, want)
	}
	if got, want := f.AllModels(), []string{"alpha/a", "empty", "gone", "loading", "mismatch", "prefill", "zeta/b"}; !slices.Equal(got, want) {
		t.Errorf("AllModels() = %v, want %v", got, want)
	}
	f.Models()[0] = "mutated"
	if f.Models()[0] != "alpha/a" {
		t.Error("Models() exposes the fleet's slice")
	}

	tests := []struct {
		name    string
		model   string
		found   bool
		regular bool
	}{
		{name: "regular model", model: "zeta/b", found: true, regular: true},
		{name: "stale model is kept for its error", model: "gone", found: true},
		{name: "loading model is kept for its view", model: "loading", found: true},
		{name: "unknown model", model: "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := f.Model(tt.model)
			if ok != tt.found || (ok && m.Eligible(dispatch.RouteRegular) != tt.regular) {
				t.Errorf("Model(%q) = %v, %v", tt.model, m, ok)
			}
		})
	}
	if allocs := testing.AllocsPerRun(100, func() { f.Model("zeta/b") }); allocs != 0 {
		t.Errorf("Fleet.Model allocates %v times", allocs)
	}
}

func TestDecideAllocs(t *testing.T) {
	R, D := dispatch.PoolRegular, dispatch.PoolDecode
	both := dispatch.NewModel("m", pools(6, 2, 2, 8), t0, dispatch.DefaultConfig())
	pdOnly := dispatch.NewModel("m", pools(0, 2, 2, 8), t0, dispatch.DefaultConfig())
	none := dispatch.NewModel("m", nil, t0, dispatch.DefaultConfig())
	two := dispatch.NewModel("m", twoPairings(), t0, dispatch.DefaultConfig())
	busy := inflight{{R, ""}: {pending: 3, active: 20}, {D, "vllm"}: {active: 2}}
	full := inflight{{R, ""}: {pending: 48}, {D, "vllm"}: {pending: 16}}
	slo := dispatch.NewModel("m", sloFleet(), t0, sloConfig())
	stalePD := dispatch.NewModel("m", probeFleet(20*time.Second), t0, sloConfig())
	light := inflight{{R, ""}: {pending: 1}, {D, "vllm"}: {active: 2}}
	threshold := dispatch.NewModel("m", pools(6, 2, 2, 8), t0, cfg(dispatch.ModeThreshold))
	long := dispatch.Need{PromptTokens: 8000, Targets: sloTargets, Cache: cache{{R, ""}: 100}}
	short := dispatch.Need{PromptTokens: 100, Targets: sloTargets}
	tests := []struct {
		name  string
		m     *dispatch.Model
		need  dispatch.Need
		seen  dispatch.InFlight
		r     uint64
		limit float64
	}{
		{name: "pd", m: both, r: 0},
		{name: "regular", m: both, r: math.MaxUint64},
		{name: "pd, seen", m: both, seen: busy, r: 0},
		{name: "regular, seen", m: both, seen: busy, r: math.MaxUint64},
		{name: "saturated by seen", m: both, seen: full, r: 1 << 62},
		{name: "two pairings, seen", m: two, seen: busy, r: 1 << 62},
		{name: "NoPD regular", m: both, need: dispatch.Need{NoPD: true, Reason: "n > 1"}},
		{name: "ErrNoCapacity", m: none},
		{name: "ErrNoCapacity, seen", m: none, seen: busy},
		{name: "ErrNoCapacity NoPD", m: none, need: dispatch.Need{NoPD: true, Reason: "n > 1"}},
		{name: "ErrUnsupported without reason", m: pdOnly, need: dispatch.Need{NoPD: true}},
		// The reason is the caller's string: carrying it costs one struct.
		{name: "ErrUnsupported with reason", m: pdOnly, need: dispatch.Need{NoPD: true, Reason: "n > 1"}, limit: 1},
		{name: "slo pd", m: slo, need: long},
		{name: "slo regular, seen", m: slo, need: short, seen: busy},
		{name: "slo all full", m: slo, need: long, seen: full},
		{name: "slo without targets", m: slo, need: dispatch.Need{PromptTokens: 100}},
		{name: "slo probe, seen", m: stalePD, need: short, seen: light, r: 0},
		{name: "slo no probe, seen", m: stalePD, need: short, seen: light, r: 1<<11 - 1},
		{name: "threshold pd, seen", m: threshold, need: long, seen: busy},
		{name: "threshold all full", m: threshold, need: short, seen: full},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sink error
			allocs := testing.AllocsPerRun(1000, func() {
				_, sink = tt.m.Decide(tt.need, tt.seen, tt.r)
			})
			_ = sink
			if allocs > tt.limit {
				t.Errorf("Decide allocates %v times, want at most %v", allocs, tt.limit)
			}
		})
	}
}
