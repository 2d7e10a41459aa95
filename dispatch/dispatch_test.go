package dispatch_test

import (
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// ready returns a fully ramped, fresh agent; prefill and decode agents
// speak vllm with no labels, so they pair with each other.
func ready(id string, pool dispatch.Pool, slots, active int) dispatch.Agent {
	a := dispatch.Agent{
		ID:         id,
		Pool:       pool,
		State:      dispatch.StateReady,
		Slots:      slots,
		Active:     active,
		ReadySince: t0.Add(-time.Hour),
		LastSeen:   t0,
		Interval:   time.Second,
	}
	if pool == dispatch.PoolPrefill || pool == dispatch.PoolDecode {
		a.PDProtocol = "vllm"
	}
	return a
}

// pools returns n agents of each pool with equal slots, idle.
func pools(nRegular, nPrefill, nDecode, slots int) []dispatch.Agent {
	var as []dispatch.Agent
	for range nRegular {
		as = append(as, ready("r", dispatch.PoolRegular, slots, 0))
	}
	for range nPrefill {
		as = append(as, ready("p", dispatch.PoolPrefill, slots, 0))
	}
	for range nDecode {
		as = append(as, ready("d", dispatch.PoolDecode, slots, 0))
	}
	return as
}

func with(a dispatch.Agent, f func(*dispatch.Agent)) dispatch.Agent {
	f(&a)
	return a
}

func warming(a dispatch.Agent) dispatch.Agent {
	a.State = dispatch.StateWarming
	a.ReadySince = time.Time{}
	return a
}

func sglang(a dispatch.Agent) dispatch.Agent {
	a.PDProtocol = "sglang"
	return a
}

// twoPairings: 1 regular (8 free), a vllm pairing of 1P + 1D (PD weight 8)
// and an sglang pairing with labels of 2P + 2D whose decode agents hold 4
// (PD weight min(12, 16) = 12).
func twoPairings() []dispatch.Agent {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	mc := func(a dispatch.Agent) dispatch.Agent {
		a.PDProtocol, a.PDLabels = "sglang", "kv=mooncake"
		return a
	}
	return []dispatch.Agent{
		ready("r", R, 8, 0),
		ready("p1", P, 8, 0), ready("d1", D, 8, 0),
		mc(ready("p2", P, 8, 0)), mc(ready("p3", P, 8, 0)),
		mc(ready("d2", D, 8, 2)), mc(ready("d3", D, 8, 2)),
	}
}

func cfg(mode dispatch.Mode) dispatch.Config {
	c := dispatch.DefaultConfig()
	c.Mode = mode
	return c
}

func TestWeights(t *testing.T) {
	const (
		capacity = dispatch.ModeCapacity
		paired   = dispatch.ModePaired
		count    = dispatch.ModeCount
	)
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	busy := []dispatch.Agent{ // the worked example of docs/dispatch.md
		ready("r1", R, 8, 8), ready("r2", R, 8, 8), ready("r3", R, 8, 6),
		ready("r4", R, 8, 4), ready("r5", R, 8, 4), ready("r6", R, 8, 0),
		ready("p1", P, 8, 4), ready("p2", P, 8, 0),
		ready("d1", D, 8, 5),
	}
	full := []dispatch.Agent{
		ready("r1", R, 8, 8), ready("r2", R, 8, 9),
		ready("p1", P, 8, 8), ready("d1", D, 4, 4),
	}
	tests := []struct {
		name          string
		mode          dispatch.Mode
		agents        []dispatch.Agent
		wantR, wantPD float64
		saturated     bool
	}{
		{name: "2P2D6R count", mode: count, agents: pools(6, 2, 2, 8), wantR: 6, wantPD: 4},
		{name: "2P2D6R paired", mode: paired, agents: pools(6, 2, 2, 8), wantR: 6, wantPD: 4},
		{name: "2P2D6R capacity", mode: capacity, agents: pools(6, 2, 2, 8), wantR: 48, wantPD: 16},
		{name: "10P1D6R count", mode: count, agents: pools(6, 10, 1, 8), wantR: 6, wantPD: 11},
		{name: "10P1D6R paired", mode: paired, agents: pools(6, 10, 1, 8), wantR: 6, wantPD: 2},
		{name: "10P1D6R capacity", mode: capacity, agents: pools(6, 10, 1, 8), wantR: 48, wantPD: 8},
		{name: "concurrency unit: 2R 1P 1D capacity", mode: capacity, agents: pools(2, 1, 1, 8), wantR: 16, wantPD: 8},
		{
			name: "heterogeneous slots capacity", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 16, 0), ready("r2", R, 16, 0), ready("p", P, 8, 0), ready("d", D, 4, 0)},
			wantR:  32, wantPD: 4,
		},
		{name: "partial fullness capacity", mode: capacity, agents: busy, wantR: 18, wantPD: 3},
		{name: "partial fullness count ignores load", mode: count, agents: busy, wantR: 6, wantPD: 3},
		{name: "partial fullness paired ignores load", mode: paired, agents: busy, wantR: 6, wantPD: 2},
		{name: "all full falls back to effective slots", mode: capacity, agents: full, wantR: 16, wantPD: 4, saturated: true},
		{
			name: "regular full, PD free", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 8), ready("p", P, 8, 2), ready("d", D, 8, 0)},
			wantR:  0, wantPD: 6,
		},
		{
			name: "decode full, regular free: no fallback", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 7), ready("p", P, 8, 0), ready("d", D, 8, 8)},
			wantR:  1, wantPD: 0,
		},
		{
			name: "regular and decode full, prefill free: fallback", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 8), ready("p", P, 8, 0), ready("d", D, 8, 8)},
			wantR:  8, wantPD: 8, saturated: true,
		},
		{name: "prefill without decode capacity", mode: capacity, agents: pools(2, 3, 0, 8), wantR: 16, wantPD: 0},
		{name: "prefill without decode count", mode: count, agents: pools(2, 3, 0, 8), wantR: 2, wantPD: 0},
		{name: "prefill without decode paired", mode: paired, agents: pools(2, 3, 0, 8), wantR: 2, wantPD: 0},
		{name: "decode without prefill capacity", mode: capacity, agents: pools(2, 0, 3, 8), wantR: 16, wantPD: 0},
		{name: "decode without prefill count", mode: count, agents: pools(2, 0, 3, 8), wantR: 2, wantPD: 0},
		{
			name: "draining decode counts zero", mode: count,
			agents: append(pools(2, 1, 0, 8), with(ready("d", D, 8, 0), func(a *dispatch.Agent) { a.State = dispatch.StateDraining })),
			wantR:  2, wantPD: 0,
		},
		{
			name: "draining regular counts zero", mode: capacity,
			agents: append(pools(1, 1, 1, 8), with(ready("r2", R, 8, 0), func(a *dispatch.Agent) { a.State = dispatch.StateDraining })),
			wantR:  8, wantPD: 8,
		},
		{
			name: "stale prefill counts zero", mode: capacity,
			agents: append(pools(1, 0, 1, 8), with(ready("p", P, 8, 0), func(a *dispatch.Agent) { a.LastSeen = t0.Add(-3 * time.Second) })),
			wantR:  8, wantPD: 0,
		},
		{
			// A loading PD pair beside a busy regular agent must not draw
			// requests into a queue nobody pulls.
			name: "warming PD pair beside a full regular agent counts zero", mode: capacity,
			agents: []dispatch.Agent{ready("r", R, 4, 4), warming(ready("p", P, 8, 0)), warming(ready("d", D, 8, 0))},
			wantR:  4, wantPD: 0, saturated: true,
		},
		{
			name: "warming PD pair count", mode: count,
			agents: []dispatch.Agent{ready("r", R, 4, 4), warming(ready("p", P, 8, 0)), warming(ready("d", D, 8, 0))},
			wantR:  1, wantPD: 0,
		},
		{
			name: "warming regular agent counts zero", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 2), warming(ready("r2", R, 8, 0)), ready("p", P, 8, 0), ready("d", D, 8, 0)},
			wantR:  6, wantPD: 8,
		},
		{
			name: "ramping decode bounds PD", mode: capacity,
			agents: []dispatch.Agent{
				ready("r", R, 8, 0), ready("p", P, 8, 0),
				with(ready("d", D, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0.Add(-15 * time.Second) }),
			},
			wantR: 8, wantPD: 8, // decode at 11 of 20, prefill 8
		},
		{
			name: "pull limit caps decode", mode: capacity,
			agents: []dispatch.Agent{
				ready("r", R, 8, 0), ready("p", P, 8, 0),
				with(ready("d", D, 8, 0), func(a *dispatch.Agent) { a.PullLimit = 3 }),
			},
			wantR: 8, wantPD: 3,
		},
		{
			name: "one agent over its slots: pool-level free", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 10), ready("r2", R, 8, 0)},
			wantR:  6,
		},
		{
			name: "mismatched pairing counts zero", mode: capacity,
			agents: []dispatch.Agent{ready("r", R, 8, 0), ready("p", P, 8, 0), sglang(ready("d", D, 8, 0))},
			wantR:  8, wantPD: 0,
		},
		{
			name: "mismatched pairing count", mode: count,
			agents: []dispatch.Agent{ready("r", R, 8, 0), ready("p", P, 8, 0), sglang(ready("d", D, 8, 0))},
			wantR:  1, wantPD: 0,
		},
		{
			name: "two pairings capacity", mode: capacity, agents: twoPairings(),
			wantR: 8, wantPD: 8 + 12,
		},
		{
			name: "two pairings paired", mode: paired, agents: twoPairings(),
			wantR: 1, wantPD: 2 + 4,
		},
		{
			name: "two pairings count", mode: count, agents: twoPairings(),
			wantR: 1, wantPD: 2 + 4,
		},
		{
			name: "count sums over eligible pairings only", mode: count,
			agents: append(twoPairings(), with(ready("p9", P, 8, 0), func(a *dispatch.Agent) { a.PDLabels = "kv=lmcache" })),
			wantR:  1, wantPD: 2 + 4,
		},
		{name: "no agents capacity", mode: capacity},
		{name: "no agents count", mode: count},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", tt.agents, t0, cfg(tt.mode))
			r, pd := m.Weights()
			if r != tt.wantR || pd != tt.wantPD {
				t.Errorf("Weights() = (%v, %v), want (%v, %v)", r, pd, tt.wantR, tt.wantPD)
			}
			if m.Saturated() != tt.saturated {
				t.Errorf("Saturated() = %v, want %v", m.Saturated(), tt.saturated)
			}
			if got := m.Eligible(dispatch.RoutePD); got && tt.wantPD == 0 && tt.mode != dispatch.ModeCapacity {
				t.Errorf("Eligible(pd) = true with PD weight 0 in %v mode", tt.mode)
			}
		})
	}
}

func TestAgentEligibility(t *testing.T) {
	c := dispatch.DefaultConfig() // 30s ramp from 10%, 3 missed heartbeats
	tests := []struct {
		name       string
		cfg        dispatch.Config
		agent      dispatch.Agent
		eligible   bool
		effective  float64
		free       float64
		wantReason string
	}{
		{name: "ready, ramped, idle", cfg: c, agent: ready("a", 0, 10, 0), eligible: true, effective: 10, free: 10},
		{name: "ready, busy", cfg: c, agent: ready("a", 0, 10, 4), eligible: true, effective: 10, free: 6},
		{name: "active above slots frees nothing", cfg: c, agent: ready("a", 0, 10, 12), eligible: true, effective: 10, free: 0},
		{name: "negative active counts as idle", cfg: c, agent: ready("a", 0, 10, -3), eligible: true, effective: 10, free: 10},
		{
			name: "slow start: ready just now has the floor", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0 }),
			eligible: true, effective: 2, free: 2,
		},
		{
			name: "slow start: halfway has the midpoint", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0.Add(-15 * time.Second) }),
			eligible: true, effective: 11, free: 11,
		},
		{
			name: "slow start: a quarter in", cfg: c,
			agent:    with(ready("a", 0, 20, 1), func(a *dispatch.Agent) { a.ReadySince = t0.Add(-7500 * time.Millisecond) }),
			eligible: true, effective: 6.5, free: 5.5,
		},
		{
			name: "slow start: window over has full slots", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0.Add(-30 * time.Second) }),
			eligible: true, effective: 20, free: 20,
		},
		{
			name: "slow start: floor is at least one slot", cfg: c,
			agent:    with(ready("a", 0, 4, 0), func(a *dispatch.Agent) { a.ReadySince = t0 }),
			eligible: true, effective: 1, free: 1,
		},
		{
			name: "slow start: small agent ramps smoothly", cfg: c,
			agent:    with(ready("a", 0, 2, 0), func(a *dispatch.Agent) { a.ReadySince = t0.Add(-15 * time.Second) }),
			eligible: true, effective: 1.5, free: 1.5,
		},
		{
			name: "slow start: one-slot agent counts one", cfg: c,
			agent:    with(ready("a", 0, 1, 0), func(a *dispatch.Agent) { a.ReadySince = t0 }),
			eligible: true, effective: 1, free: 1,
		},
		{
			name: "slow start: ReadySince in the future has the floor", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0.Add(time.Minute) }),
			eligible: true, effective: 2, free: 2,
		},
		{
			name: "slow start disabled", cfg: dispatch.Config{},
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0 }),
			eligible: true, effective: 20, free: 20,
		},
		{
			name: "ready without ReadySince counts in full", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = time.Time{} }),
			eligible: true, effective: 20, free: 20,
		},
		{
			name: "warming counts zero", cfg: c,
			agent:      warming(ready("a", 0, 20, 0)),
			wantReason: dispatch.ReasonWarming,
		},
		{
			name: "warming says why", cfg: c,
			agent: with(warming(ready("a", dispatch.PoolDecode, 20, 0)), func(a *dispatch.Agent) {
				a.StateReason = "engine not healthy yet: GET /health: 503"
			}),
			wantReason: "warming: engine not healthy yet: GET /health: 503",
		},
		{
			name: "warming with a ReadySince still counts zero", cfg: c,
			agent:      with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.State = dispatch.StateWarming }),
			wantReason: dispatch.ReasonWarming,
		},
		{
			name: "stale warming is stale", cfg: c,
			agent:      with(warming(ready("a", 0, 20, 0)), func(a *dispatch.Agent) { a.LastSeen = t0.Add(-time.Minute) }),
			wantReason: dispatch.ReasonStale,
		},
		{
			name: "pull limit caps effective slots", cfg: c,
			agent:    with(ready("a", 0, 20, 2), func(a *dispatch.Agent) { a.PullLimit = 5 }),
			eligible: true, effective: 5, free: 3,
		},
		{
			name: "pull limit above the ramp changes nothing", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0.Add(-15 * time.Second); a.PullLimit = 15 }),
			eligible: true, effective: 11, free: 11,
		},
		{
			name: "pull limit below the ramp wins", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.ReadySince = t0.Add(-15 * time.Second); a.PullLimit = 4 }),
			eligible: true, effective: 4, free: 4,
		},
		{
			name: "pull limit 0 is not reported", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.PullLimit = 0 }),
			eligible: true, effective: 20, free: 20,
		},
		{
			name: "draining counts zero", cfg: c,
			agent:      with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.State = dispatch.StateDraining }),
			wantReason: dispatch.ReasonDraining,
		},
		{name: "zero slots counts zero", cfg: c, agent: ready("a", 0, 0, 0), wantReason: dispatch.ReasonNoSlots},
		{name: "negative slots counts zero", cfg: c, agent: ready("a", 0, -1, 0), wantReason: dispatch.ReasonNoSlots},
		{
			name: "2.9 intervals old still counts", cfg: c,
			agent:    with(ready("a", 0, 8, 0), func(a *dispatch.Agent) { a.LastSeen = t0.Add(-2900 * time.Millisecond) }),
			eligible: true, effective: 8, free: 8,
		},
		{
			name: "3 intervals old is gone", cfg: c,
			agent:      with(ready("a", 0, 8, 0), func(a *dispatch.Agent) { a.LastSeen = t0.Add(-3 * time.Second) }),
			wantReason: dispatch.ReasonStale,
		},
		{
			name: "stale with a long interval", cfg: c,
			agent: with(ready("a", 0, 8, 0), func(a *dispatch.Agent) {
				a.Interval = 5 * time.Second
				a.LastSeen = t0.Add(-16 * time.Second)
			}),
			wantReason: dispatch.ReasonStale,
		},
		{
			name: "fresh with a long interval", cfg: c,
			agent: with(ready("a", 0, 8, 0), func(a *dispatch.Agent) {
				a.Interval = 5 * time.Second
				a.LastSeen = t0.Add(-14 * time.Second)
			}),
			eligible: true, effective: 8, free: 8,
		},
		{
			name: "zero interval is treated as 1s", cfg: c,
			agent: with(ready("a", 0, 8, 0), func(a *dispatch.Agent) {
				a.Interval = 0
				a.LastSeen = t0.Add(-3 * time.Second)
			}),
			wantReason: dispatch.ReasonStale,
		},
		{
			name: "MissedHeartbeats 5", cfg: dispatch.Config{MissedHeartbeats: 5},
			agent:    with(ready("a", 0, 8, 0), func(a *dispatch.Agent) { a.LastSeen = t0.Add(-4 * time.Second) }),
			eligible: true, effective: 8, free: 8,
		},
		{
			name: "never seen is stale", cfg: c,
			agent:      with(ready("a", 0, 8, 0), func(a *dispatch.Agent) { a.LastSeen = time.Time{} }),
			wantReason: dispatch.ReasonStale,
		},
		{name: "unknown pool", cfg: c, agent: ready("a", 7, 8, 0), wantReason: dispatch.ReasonUnknownPool},
		{
			name: "decode without a PD protocol", cfg: c,
			agent:      with(ready("a", dispatch.PoolDecode, 8, 0), func(a *dispatch.Agent) { a.PDProtocol = "" }),
			wantReason: dispatch.ReasonNoProtocol,
		},
		{
			name: "prefill with labels but no protocol", cfg: c,
			agent:      with(ready("a", dispatch.PoolPrefill, 8, 0), func(a *dispatch.Agent) { a.PDProtocol, a.PDLabels = "", "kv=nixl" }),
			wantReason: dispatch.ReasonNoProtocol,
		},
		{
			name: "regular ignores PD fields", cfg: c,
			agent:    with(ready("a", 0, 8, 0), func(a *dispatch.Agent) { a.PDProtocol, a.PDLabels = "sglang", "kv=nixl" }),
			eligible: true, effective: 8, free: 8,
		},
		{
			name: "unknown state", cfg: c,
			agent:      with(ready("a", 0, 8, 0), func(a *dispatch.Agent) { a.State = 9 }),
			wantReason: dispatch.ReasonUnknownState,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", []dispatch.Agent{tt.agent}, t0, tt.cfg)
			v := m.Agents()[0]
			if v.Eligible != tt.eligible || v.Reason != tt.wantReason {
				t.Errorf("Eligible, Reason = %v, %q; want %v, %q", v.Eligible, v.Reason, tt.eligible, tt.wantReason)
			}
			if math.Abs(v.EffectiveSlots-tt.effective) > 1e-9 || math.Abs(v.Free-tt.free) > 1e-9 {
				t.Errorf("EffectiveSlots, Free = %v, %v; want %v, %v", v.EffectiveSlots, v.Free, tt.effective, tt.free)
			}
			if v.Agent != tt.agent {
				t.Errorf("view holds %+v, want %+v", v.Agent, tt.agent)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	noPD := dispatch.Need{NoPD: true, Reason: "n > 1 is not supported by vLLM PD"}
	draining := func(a dispatch.Agent) dispatch.Agent {
		a.State = dispatch.StateDraining
		return a
	}
	tests := []struct {
		name   string
		agents []dispatch.Agent
		need   dispatch.Need
		r      uint64
		want   dispatch.Route
		// wantPair is the pairing of a PD decision; "" means "vllm".
		wantPair string
		wantErr  error
		errHas   string
	}{
		{name: "low r goes PD", agents: pools(6, 2, 2, 8), r: 0, want: dispatch.RoutePD},
		{name: "high r goes regular", agents: pools(6, 2, 2, 8), r: math.MaxUint64, want: dispatch.RouteRegular},
		{name: "PD only, high r", agents: pools(0, 1, 1, 8), r: math.MaxUint64, want: dispatch.RoutePD},
		{name: "regular only, low r", agents: pools(3, 0, 0, 8), r: 0, want: dispatch.RouteRegular},
		{name: "prefill without decode never PD", agents: pools(1, 5, 0, 8), r: 0, want: dispatch.RouteRegular},
		{name: "decode without prefill never PD", agents: pools(1, 0, 5, 8), r: 0, want: dispatch.RouteRegular},
		{name: "no agents", r: 0, wantErr: dispatch.ErrNoCapacity, errHas: `model "m"`},
		{name: "prefill only", agents: pools(0, 3, 0, 8), wantErr: dispatch.ErrNoCapacity},
		{
			name:    "all draining",
			agents:  []dispatch.Agent{draining(ready("r", R, 8, 0)), draining(ready("p", P, 8, 0)), draining(ready("d", D, 8, 0))},
			wantErr: dispatch.ErrNoCapacity,
		},
		{name: "NoPD with regular", agents: pools(1, 4, 4, 8), need: noPD, r: 0, want: dispatch.RouteRegular},
		{
			name: "NoPD with full regular still regular", need: noPD, r: 0, want: dispatch.RouteRegular,
			agents: []dispatch.Agent{ready("r", R, 8, 8), ready("p", P, 8, 0), ready("d", D, 8, 0)},
		},
		{
			name: "NoPD without regular", agents: pools(0, 2, 2, 8), need: noPD,
			wantErr: dispatch.ErrUnsupported, errHas: "n > 1 is not supported by vLLM PD",
		},
		{
			name: "NoPD without regular, no reason", agents: pools(0, 2, 2, 8), need: dispatch.Need{NoPD: true},
			wantErr: dispatch.ErrUnsupported, errHas: `model "m" has no eligible regular agent`,
		},
		{
			name: "NoPD with regular draining", need: noPD, wantErr: dispatch.ErrUnsupported,
			agents: []dispatch.Agent{draining(ready("r", R, 8, 0)), ready("p", P, 8, 0), ready("d", D, 8, 0)},
		},
		{name: "NoPD, no agents", need: noPD, wantErr: dispatch.ErrNoCapacity},
		{
			name: "warming pair beside a full regular agent, low r", r: 0, want: dispatch.RouteRegular,
			agents: []dispatch.Agent{ready("r", R, 4, 4), warming(ready("p", P, 8, 0)), warming(ready("d", D, 8, 0))},
		},
		{
			name: "warming only", r: 0, wantErr: dispatch.ErrNoCapacity,
			agents: []dispatch.Agent{warming(ready("r", R, 4, 0)), warming(ready("p", P, 8, 0)), warming(ready("d", D, 8, 0))},
		},
		{
			name: "NoPD with warming regular", need: noPD, wantErr: dispatch.ErrUnsupported,
			agents: []dispatch.Agent{warming(ready("r", R, 8, 0)), ready("p", P, 8, 0), ready("d", D, 8, 0)},
		},
		{
			name: "mismatched pairing never PD", r: 0, want: dispatch.RouteRegular,
			agents: []dispatch.Agent{ready("r", R, 8, 8), ready("p", P, 8, 0), sglang(ready("d", D, 8, 0))},
		},
		{
			name: "mismatched pairing only", r: 0, wantErr: dispatch.ErrNoCapacity,
			agents: []dispatch.Agent{ready("p", P, 8, 0), sglang(ready("d", D, 8, 0))},
		},
		{
			name: "two pairings, low r takes the last pairing in key order", agents: twoPairings(), r: 0,
			want: dispatch.RoutePD, wantPair: "vllm",
		},
		{name: "two pairings, high r takes regular", agents: twoPairings(), r: math.MaxUint64, want: dispatch.RouteRegular},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", tt.agents, t0, dispatch.DefaultConfig())
			d, err := m.Decide(tt.need, nil, tt.r)
			got := d.Route
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Decide() error = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), tt.errHas) {
					t.Errorf("error %q does not contain %q", err, tt.errHas)
				}
				return
			}
			if got != tt.want {
				t.Errorf("Decide() = %v, want %v", got, tt.want)
			}
			if !m.Eligible(got) {
				t.Errorf("Decide() = %v, which is not Eligible", got)
			}
			wantPair := ""
			if got == dispatch.RoutePD {
				wantPair = cmp.Or(tt.wantPair, "vllm")
			}
			if d.Pair != wantPair {
				t.Errorf("Decide().Pair = %q, want %q", d.Pair, wantPair)
			}
		})
	}
}

func TestDecideNilModel(t *testing.T) {
	var m *dispatch.Model
	if _, err := m.Decide(dispatch.Need{}, nil, 0); !errors.Is(err, dispatch.ErrNoCapacity) {
		t.Fatalf("nil Model: Decide() error = %v, want ErrNoCapacity", err)
	}
}

// inflight is a fake InFlight: outstanding jobs per pool and pairing.
type inflight map[poolPair]outstanding

type poolPair struct {
	pool dispatch.Pool
	pair string
}

type outstanding struct{ pending, active int }

func (f inflight) Outstanding(pool dispatch.Pool, pair string) (pending, active int) {
	o := f[poolPair{pool, pair}]
	return o.pending, o.active
}

var _ dispatch.InFlight = inflight(nil)

// destination names a decision: "regular" or "pd <pairing>".
func destination(d dispatch.Decision) string {
	if d.Route == dispatch.RoutePD {
		return "pd " + d.Pair
	}
	return d.Route.String()
}

// TestSplit is the reference gateway's statistical test, plus the fleets
// where count and capacity part ways, pairings, saturation and what the
// broker saw between heartbeats. Measured shares go to docs/dispatch.md
// (go test -v -run TestSplit).
func TestSplit(t *testing.T) {
	const n = 10_000
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	tests := []struct {
		name   string
		mode   dispatch.Mode
		agents []dispatch.Agent
		seen   dispatch.InFlight
		want   map[string]float64 // share per destination
	}{
		{name: "6R 2P 2D count", mode: dispatch.ModeCount, agents: pools(6, 2, 2, 8), want: map[string]float64{"pd vllm": 4.0 / 10}},
		{name: "6R 2P 2D paired", mode: dispatch.ModePaired, agents: pools(6, 2, 2, 8), want: map[string]float64{"pd vllm": 4.0 / 10}},
		{name: "6R 2P 2D capacity", mode: dispatch.ModeCapacity, agents: pools(6, 2, 2, 8), want: map[string]float64{"pd vllm": 16.0 / 64}},
		{name: "6R 10P 1D count", mode: dispatch.ModeCount, agents: pools(6, 10, 1, 8), want: map[string]float64{"pd vllm": 11.0 / 17}},
		{name: "6R 10P 1D paired", mode: dispatch.ModePaired, agents: pools(6, 10, 1, 8), want: map[string]float64{"pd vllm": 2.0 / 8}},
		{name: "6R 10P 1D capacity", mode: dispatch.ModeCapacity, agents: pools(6, 10, 1, 8), want: map[string]float64{"pd vllm": 8.0 / 56}},
		{
			// The rollout's fleet: PD holds one decode slot per request,
			// so it gets 8 of 24 concurrent requests, not 16 of 32.
			name: "concurrency unit 2R 1P 1D capacity", agents: pools(2, 1, 1, 8),
			want: map[string]float64{"pd vllm": 8.0 / 24},
		},
		{
			name: "two pairings capacity", agents: twoPairings(),
			want: map[string]float64{"regular": 8.0 / 28, "pd vllm": 8.0 / 28, "pd sglang+kv=mooncake": 12.0 / 28},
		},
		{
			name: "two pairings count", mode: dispatch.ModeCount, agents: twoPairings(),
			want: map[string]float64{"regular": 1.0 / 7, "pd vllm": 2.0 / 7, "pd sglang+kv=mooncake": 4.0 / 7},
		},
		{
			name: "saturated: in proportion to effective slots",
			agents: []dispatch.Agent{
				ready("r1", R, 8, 8), ready("r2", R, 8, 8), ready("r3", R, 8, 9),
				ready("p", P, 8, 8), ready("d", D, 4, 4),
			},
			want: map[string]float64{"pd vllm": 4.0 / 28},
		},
		{
			name:   "warming pair beside a full regular agent",
			agents: []dispatch.Agent{ready("r", R, 4, 4), warming(ready("p", P, 8, 0)), warming(ready("d", D, 8, 0))},
			want:   map[string]float64{"regular": 1},
		},
		{
			name: "dispatched not taken lowers regular", agents: pools(2, 1, 1, 8),
			seen: inflight{{R, ""}: {pending: 10}},
			want: map[string]float64{"pd vllm": 8.0 / 14},
		},
		{
			name: "decode held since the heartbeat lowers PD", agents: pools(2, 1, 1, 8),
			seen: inflight{{D, "vllm"}: {active: 6}},
			want: map[string]float64{"pd vllm": 2.0 / 18},
		},
		{
			name: "full by what the broker saw: in proportion", agents: pools(2, 1, 1, 8),
			seen: inflight{{R, ""}: {pending: 9, active: 7}, {D, "vllm"}: {active: 8}},
			want: map[string]float64{"pd vllm": 8.0 / 24},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", tt.agents, t0, cfg(tt.mode))
			rng := rand.New(rand.NewPCG(1, 2))
			counts := map[string]int{}
			for range n {
				d, err := m.Decide(dispatch.Need{}, tt.seen, rng.Uint64())
				if err != nil {
					t.Fatal(err)
				}
				counts[destination(d)]++
			}
			for dest := range counts {
				if _, ok := tt.want[dest]; !ok && dest != "regular" {
					t.Errorf("%d decisions went to %s, want none", counts[dest], dest)
				}
			}
			for dest, want := range tt.want {
				got := float64(counts[dest]) / n
				t.Logf("%s share %.4f, want %.4f, error %+.4f", dest, got, want, got-want)
				if math.Abs(got-want) > 0.02 {
					t.Errorf("%s share %.4f over %d decisions, want %.4f ± 0.02", dest, got, n, want)
				}
			}
		})
	}
}

// TestInFlight checks the weights Decide uses when the broker knows more
// than the last heartbeats: jobs dispatched and not taken yet, and jobs
// taken since.
func TestInFlight(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	tests := []struct {
		name      string
		mode      dispatch.Mode
		agents    []dispatch.Agent
		seen      dispatch.InFlight
		wantR     float64
		wantPD    float64 // the vllm pairing
		saturated bool
	}{
		{name: "nil: heartbeats only", agents: pools(2, 1, 1, 8), wantR: 16, wantPD: 8},
		{name: "nothing outstanding", agents: pools(2, 1, 1, 8), seen: inflight{}, wantR: 16, wantPD: 8},
		{name: "dispatched not taken", agents: pools(2, 1, 1, 8), seen: inflight{{R, ""}: {pending: 10}}, wantR: 6, wantPD: 8},
		{
			name: "taken since the heartbeat", seen: inflight{{R, ""}: {active: 5}},
			agents: []dispatch.Agent{ready("r1", R, 8, 2), ready("r2", R, 8, 0), ready("p", P, 8, 0), ready("d", D, 8, 0)},
			wantR:  11, wantPD: 8,
		},
		{
			name: "heartbeat ahead of the broker's count", seen: inflight{{R, ""}: {active: 2}},
			agents: []dispatch.Agent{ready("r1", R, 8, 6), ready("r2", R, 8, 0), ready("p", P, 8, 0), ready("d", D, 8, 0)},
			wantR:  10, wantPD: 8,
		},
		{
			name: "pending and held", seen: inflight{{R, ""}: {pending: 3, active: 5}},
			agents: []dispatch.Agent{ready("r1", R, 8, 2), ready("r2", R, 8, 0), ready("p", P, 8, 0), ready("d", D, 8, 0)},
			wantR:  8, wantPD: 8,
		},
		{name: "decode held bounds PD", agents: pools(2, 1, 1, 8), seen: inflight{{D, "vllm"}: {active: 6}}, wantR: 16, wantPD: 2},
		{name: "prefill pending bounds PD", agents: pools(2, 1, 1, 8), seen: inflight{{P, "vllm"}: {pending: 7}}, wantR: 16, wantPD: 1},
		{name: "another pairing's jobs do not count", agents: pools(2, 1, 1, 8), seen: inflight{{D, "sglang"}: {active: 8}}, wantR: 16, wantPD: 8},
		{
			name:   "jobs held by a draining agent are not charged to the others",
			agents: append(pools(2, 1, 1, 8), with(ready("r3", R, 8, 4), func(a *dispatch.Agent) { a.State = dispatch.StateDraining })),
			seen:   inflight{{R, ""}: {active: 4}},
			wantR:  16, wantPD: 8,
		},
		{
			name: "all full by what the broker saw: fall back", agents: pools(2, 1, 1, 8),
			seen:  inflight{{R, ""}: {pending: 16}, {D, "vllm"}: {pending: 8}},
			wantR: 16, wantPD: 8, saturated: true,
		},
		{name: "negative counts are ignored", agents: pools(2, 1, 1, 8), seen: inflight{{R, ""}: {pending: -5, active: -5}}, wantR: 16, wantPD: 8},
		{name: "count mode ignores them", mode: dispatch.ModeCount, agents: pools(2, 1, 1, 8), seen: inflight{{R, ""}: {pending: 16}}, wantR: 2, wantPD: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", tt.agents, t0, cfg(tt.mode))
			r, pairs, saturated := m.LiveWeights(tt.seen)
			if r != tt.wantR || saturated != tt.saturated {
				t.Errorf("LiveWeights() regular %v, saturated %v; want %v, %v", r, saturated, tt.wantR, tt.saturated)
			}
			if len(pairs) != 1 || pairs[0].Key != "vllm" || pairs[0].Weight != tt.wantPD {
				t.Errorf("LiveWeights() pairs = %+v, want vllm with weight %v", pairs, tt.wantPD)
			}
			if tt.seen == nil {
				if wr, wpd := m.Weights(); wr != r || wpd != pairs[0].Weight {
					t.Errorf("Weights() = %v, %v; LiveWeights(nil) = %v, %v", wr, wpd, r, pairs[0].Weight)
				}
			}
			// Decide follows the same weights: with a PD share of 0 or 1
			// every draw must say so.
			for _, u := range []uint64{0, 1 << 63, math.MaxUint64} {
				d, err := m.Decide(dispatch.Need{}, tt.seen, u)
				if err != nil {
					t.Fatal(err)
				}
				if (tt.wantPD == 0 && d.Route == dispatch.RoutePD) || (tt.wantR == 0 && d.Route == dispatch.RouteRegular) {
					t.Errorf("Decide(r=%#x) = %+v against weights %v, %v", u, d, tt.wantR, tt.wantPD)
				}
			}
		})
	}
}

// TestNeverHealthy: an agent whose engine never becomes healthy keeps
// heartbeating as warming; it must count zero however long that lasts.
func TestNeverHealthy(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	tests := []struct {
		name  string
		after time.Duration
	}{
		{name: "at start", after: 0},
		{name: "after a slow-start window", after: dispatch.DefaultSlowStart},
		{name: "after an hour", after: time.Hour},
		{name: "after a month", after: 30 * 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0.Add(tt.after)
			stuck := func(a dispatch.Agent) dispatch.Agent {
				a = warming(a)
				a.LastSeen = now // still heartbeating
				a.StateReason = "engine not healthy yet: connection refused"
				return a
			}
			agents := []dispatch.Agent{stuck(ready("r", R, 8, 0)), stuck(ready("p", P, 8, 0)), stuck(ready("d", D, 8, 0))}
			f := dispatch.NewFleet(map[string][]dispatch.Agent{"m": agents}, now, dispatch.DefaultConfig())
			if got := f.Models(); len(got) != 0 {
				t.Errorf("Models() = %v, want none", got)
			}
			m, _ := f.Model("m")
			for _, ps := range m.Pools() {
				if ps.Eligible != 0 || ps.EffectiveSlots != 0 || ps.Agents != 1 {
					t.Errorf("pool %v = %+v, want 1 agent, none eligible", ps.Pool, ps)
				}
			}
			for _, v := range m.Agents() {
				if v.Eligible || v.EffectiveSlots != 0 || v.Reason != "warming: engine not healthy yet: connection refused" {
					t.Errorf("agent %s: eligible %v, effective %v, reason %q", v.ID, v.Eligible, v.EffectiveSlots, v.Reason)
				}
			}
			if _, err := m.Decide(dispatch.Need{}, inflight{}, 0); !errors.Is(err, dispatch.ErrNoCapacity) {
				t.Errorf("Decide() error = %v, want ErrNoCapacity", err)
			}
		})
	}
}

func TestPairing(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	labels := func(l string) func(*dispatch.Agent) { return func(a *dispatch.Agent) { a.PDLabels = l } }
	type pair struct {
		key               string
		eligible          bool
		prefill, decode   int // eligible agents
		prefillN, decodeN int // all agents
		weight            float64
	}
	tests := []struct {
		name        string
		agents      []dispatch.Agent
		pd          bool
		pairs       []pair
		reasons     map[string]string // agent id -> Reason
		wantPrefill int               // eligible prefill agents of the model
	}{
		{
			name:   "vllm prefill, sglang decode",
			agents: []dispatch.Agent{ready("r", R, 8, 0), ready("p", P, 8, 0), sglang(ready("d", D, 8, 0))},
			pairs:  []pair{{key: "sglang", decodeN: 1}, {key: "vllm", prefillN: 1}},
			reasons: map[string]string{
				"p": `no PD partner: no ready decode agent with pairing "vllm"`,
				"d": `no PD partner: no ready prefill agent with pairing "sglang"`,
			},
		},
		{
			name:    "labels must match",
			agents:  []dispatch.Agent{with(ready("p", P, 8, 0), labels("kv=nixl")), ready("d", D, 8, 0)},
			pairs:   []pair{{key: "vllm", decodeN: 1}, {key: "vllm+kv=nixl", prefillN: 1}},
			reasons: map[string]string{"p": `no PD partner: no ready decode agent with pairing "vllm+kv=nixl"`},
		},
		{
			name:        "same labels pair",
			agents:      []dispatch.Agent{with(ready("p", P, 8, 0), labels("kv=nixl,v=0.11")), with(ready("d", D, 8, 2), labels("kv=nixl,v=0.11"))},
			pd:          true,
			pairs:       []pair{{key: "vllm+kv=nixl,v=0.11", eligible: true, prefill: 1, decode: 1, prefillN: 1, decodeN: 1, weight: 6}},
			reasons:     map[string]string{"p": "", "d": ""},
			wantPrefill: 1,
		},
		{
			name:    "partner still warming",
			agents:  []dispatch.Agent{ready("p", P, 8, 0), warming(ready("d", D, 8, 0))},
			pairs:   []pair{{key: "vllm", prefillN: 1, decodeN: 1}},
			reasons: map[string]string{"p": `no PD partner: no ready decode agent with pairing "vllm"`, "d": "warming"},
		},
		{
			name:    "partner draining",
			agents:  []dispatch.Agent{with(ready("p", P, 8, 0), func(a *dispatch.Agent) { a.State = dispatch.StateDraining }), ready("d", D, 8, 0)},
			pairs:   []pair{{key: "vllm", prefillN: 1, decodeN: 1}},
			reasons: map[string]string{"p": "draining", "d": `no PD partner: no ready prefill agent with pairing "vllm"`},
		},
		{
			name:   "two eligible pairings and one without partner",
			agents: append(twoPairings(), with(ready("p9", P, 8, 0), labels("kv=lmcache"))),
			pd:     true,
			pairs: []pair{
				{key: "sglang+kv=mooncake", eligible: true, prefill: 2, decode: 2, prefillN: 2, decodeN: 2, weight: 12},
				{key: "vllm", eligible: true, prefill: 1, decode: 1, prefillN: 1, decodeN: 1, weight: 8},
				{key: "vllm+kv=lmcache", prefillN: 1},
			},
			reasons:     map[string]string{"p1": "", "d2": "", "p9": `no PD partner: no ready decode agent with pairing "vllm+kv=lmcache"`},
			wantPrefill: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", tt.agents, t0, dispatch.DefaultConfig())
			if m.Eligible(dispatch.RoutePD) != tt.pd {
				t.Errorf("Eligible(pd) = %v, want %v", m.Eligible(dispatch.RoutePD), tt.pd)
			}
			var got []pair
			for _, ps := range m.Pairs() {
				if ps.Prefill.Pool != P || ps.Decode.Pool != D {
					t.Errorf("pairing %q pools = %v, %v", ps.Key, ps.Prefill.Pool, ps.Decode.Pool)
				}
				got = append(got, pair{ps.Key, ps.Eligible, ps.Prefill.Eligible, ps.Decode.Eligible, ps.Prefill.Agents, ps.Decode.Agents, ps.Weight})
			}
			if !slices.Equal(got, tt.pairs) {
				t.Errorf("Pairs() = %+v\nwant %+v", got, tt.pairs)
			}
			if n := m.Pool(P).Eligible; n != tt.wantPrefill {
				t.Errorf("prefill pool eligible = %d, want %d", n, tt.wantPrefill)
			}
			for _, v := range m.Agents() {
				want, ok := tt.reasons[v.ID]
				if !ok {
					continue
				}
				if v.Reason != want || v.Eligible != (want == "") {
					t.Errorf("agent %s: eligible %v, reason %q; want reason %q", v.ID, v.Eligible, v.Reason, want)
				}
				if !v.Eligible && v.EffectiveSlots != 0 {
					t.Errorf("agent %s not eligible with %v effective slots", v.ID, v.EffectiveSlots)
				}
				wantPair := ""
				if v.Pool != R {
					wantPair = v.PDProtocol
					if v.PDLabels != "" {
						wantPair += "+" + v.PDLabels
					}
				}
				if v.Pair != wantPair {
					t.Errorf("agent %s: Pair %q, want %q", v.ID, v.Pair, wantPair)
				}
			}
			// Never a PD decision to a pairing that cannot hand off.
			eligible := map[string]bool{}
			for _, ps := range m.Pairs() {
				eligible[ps.Key] = ps.Eligible
			}
			rng := rand.New(rand.NewPCG(3, 4))
			for range 2000 {
				d, err := m.Decide(dispatch.Need{}, inflight{}, rng.Uint64())
				if err != nil {
					if !m.Eligible(dispatch.RouteRegular) && !tt.pd && errors.Is(err, dispatch.ErrNoCapacity) {
						break
					}
					t.Fatal(err)
				}
				if d.Route == dispatch.RoutePD && !eligible[d.Pair] {
					t.Fatalf("Decide() = %+v, a pairing that is not eligible", d)
				}
			}
		})
	}
}

func TestRamp(t *testing.T) {
	c := dispatch.DefaultConfig()
	tests := []struct {
		name       string
		slots      int
		readySince time.Time
		cfg        dispatch.Config
		want       float64
	}{
		{name: "at ready: the floor", slots: 20, readySince: t0, cfg: c, want: 2},
		{name: "halfway", slots: 20, readySince: t0.Add(-15 * time.Second), cfg: c, want: 11},
		{name: "window over", slots: 20, readySince: t0.Add(-30 * time.Second), cfg: c, want: 20},
		{name: "long after", slots: 20, readySince: t0.Add(-time.Hour), cfg: c, want: 20},
		{name: "future ReadySince: the floor", slots: 20, readySince: t0.Add(time.Minute), cfg: c, want: 2},
		{name: "floor at least one slot", slots: 4, readySince: t0, cfg: c, want: 1},
		{name: "not reported: full", slots: 20, cfg: c, want: 20},
		{name: "ramp off: full", slots: 20, readySince: t0, cfg: dispatch.Config{}, want: 20},
		{name: "no slots", slots: 0, readySince: t0, cfg: c, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := dispatch.Ramp(tt.slots, tt.readySince, t0, tt.cfg); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Ramp() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPoolsAndAgents(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	agents := []dispatch.Agent{
		ready("r1", R, 8, 3),
		with(ready("r2", R, 8, 1), func(a *dispatch.Agent) { a.State = dispatch.StateDraining }),
		with(ready("p1", P, 20, 1), func(a *dispatch.Agent) { a.ReadySince = t0 }), // floor: 2
		ready("d1", D, 4, 6),
	}
	m := dispatch.NewModel("llama", agents, t0, dispatch.DefaultConfig())
	if m.Name() != "llama" || m.Mode() != dispatch.ModeCapacity || !m.At().Equal(t0) {
		t.Errorf("Name, Mode, At = %q, %v, %v", m.Name(), m.Mode(), m.At())
	}
	want := []dispatch.PoolStats{
		{Pool: R, Agents: 2, Eligible: 1, Slots: 8, EffectiveSlots: 8, Active: 4, EligibleActive: 3, Free: 5},
		{Pool: P, Agents: 1, Eligible: 1, Slots: 20, EffectiveSlots: 2, Active: 1, EligibleActive: 1, Free: 1},
		{Pool: D, Agents: 1, Eligible: 1, Slots: 4, EffectiveSlots: 4, Active: 6, EligibleActive: 6, Free: 0},
	}
	got := m.Pools()
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Pools()[%d] = %+v, want %+v", i, got[i], want[i])
		}
		if m.Pool(want[i].Pool) != want[i] {
			t.Errorf("Pool(%v) = %+v, want %+v", want[i].Pool, m.Pool(want[i].Pool), want[i])
		}
	}
	if r, pd := m.Weights(); r != 5 || pd != 0 {
		t.Errorf("Weights() = %v, %v; want 5, 0 (decode is full)", r, pd)
	}
	if !m.Eligible(dispatch.RoutePD) || !m.Eligible(dispatch.RouteRegular) {
		t.Error("both routes should be eligible")
	}

	// The snapshot is immutable: neither the input nor the returned views
	// reach it.
	agents[0].Slots = 1000
	views := m.Agents()
	views[0].EffectiveSlots = 1000
	got[0].Free = 1000
	if m.Agents()[0].EffectiveSlots != 8 || m.Pools()[0].Free != 5 {
		t.Error("snapshot changed through its input or its accessors")
	}
	if ids := []string{views[0].ID, views[1].ID, views[2].ID, views[3].ID}; ids[0] != "r1" || ids[3] != "d1" {
		t.Errorf("Agents() order = %v, want input order", ids)
	}
}

// A pool's Active is all the work its agents hold: a draining agent's live
// streams, and those of a decode agent whose prefill partner drains, still
// count there, while EligibleActive and Free count only what dispatch does.
func TestPoolActiveCountsWorkInFlight(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	draining := func(a dispatch.Agent) dispatch.Agent {
		a.State = dispatch.StateDraining
		return a
	}
	m := dispatch.NewModel("llama", []dispatch.Agent{
		draining(ready("r1", R, 8, 4)),
		draining(ready("p1", P, 8, 2)),
		ready("d1", D, 8, 4),
	}, t0, dispatch.DefaultConfig())
	want := []dispatch.PoolStats{
		{Pool: R, Agents: 1, Active: 4},
		{Pool: P, Agents: 1, Active: 2},
		{Pool: D, Agents: 1, Active: 4}, // no partner: not eligible, still busy
	}
	for i, got := range m.Pools() {
		if got != want[i] {
			t.Errorf("Pools()[%d] = %+v, want %+v", i, got, want[i])
		}
	}
	pairs := m.Pairs()
	if len(pairs) != 1 || pairs[0].Decode.Active != 4 || pairs[0].Decode.EligibleActive != 0 || pairs[0].Prefill.Active != 2 {
		t.Errorf("Pairs() = %+v, want decode active 4 (eligible 0), prefill active 2", pairs)
	}
}
