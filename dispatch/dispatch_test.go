package dispatch_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// ready returns an idle, fully ramped, fresh agent.
func ready(id string, pool dispatch.Pool, slots, active int) dispatch.Agent {
	return dispatch.Agent{
		ID:         id,
		Pool:       pool,
		State:      dispatch.StateReady,
		Slots:      slots,
		Active:     active,
		ReadySince: t0.Add(-time.Hour),
		LastSeen:   t0,
		Interval:   time.Second,
	}
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
		{name: "2P2D6R capacity", mode: capacity, agents: pools(6, 2, 2, 8), wantR: 48, wantPD: 32},
		{name: "10P1D6R count", mode: count, agents: pools(6, 10, 1, 8), wantR: 6, wantPD: 11},
		{name: "10P1D6R paired", mode: paired, agents: pools(6, 10, 1, 8), wantR: 6, wantPD: 2},
		{name: "10P1D6R capacity", mode: capacity, agents: pools(6, 10, 1, 8), wantR: 48, wantPD: 16},
		{
			name: "heterogeneous slots capacity", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 16, 0), ready("r2", R, 16, 0), ready("p", P, 8, 0), ready("d", D, 4, 0)},
			wantR:  32, wantPD: 8,
		},
		{name: "partial fullness capacity", mode: capacity, agents: busy, wantR: 18, wantPD: 6},
		{name: "partial fullness count ignores load", mode: count, agents: busy, wantR: 6, wantPD: 3},
		{name: "partial fullness paired ignores load", mode: paired, agents: busy, wantR: 6, wantPD: 2},
		{name: "all full falls back to effective slots", mode: capacity, agents: full, wantR: 16, wantPD: 8, saturated: true},
		{
			name: "regular full, PD free", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 8), ready("p", P, 8, 2), ready("d", D, 8, 0)},
			wantR:  0, wantPD: 12,
		},
		{
			name: "decode full, regular free: no fallback", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 7), ready("p", P, 8, 0), ready("d", D, 8, 8)},
			wantR:  1, wantPD: 0,
		},
		{
			name: "regular and decode full, prefill free: fallback", mode: capacity,
			agents: []dispatch.Agent{ready("r1", R, 8, 8), ready("p", P, 8, 0), ready("d", D, 8, 8)},
			wantR:  8, wantPD: 16, saturated: true,
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
			wantR:  8, wantPD: 16,
		},
		{
			name: "stale prefill counts zero", mode: capacity,
			agents: append(pools(1, 0, 1, 8), with(ready("p", P, 8, 0), func(a *dispatch.Agent) { a.LastSeen = t0.Add(-3 * time.Second) })),
			wantR:  8, wantPD: 0,
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
			name: "warming counts at the floor", cfg: c,
			agent:    with(ready("a", 0, 20, 0), func(a *dispatch.Agent) { a.State = dispatch.StateWarming; a.ReadySince = time.Time{} }),
			eligible: true, effective: 2, free: 2,
		},
		{
			name: "warming busy beyond the floor frees nothing", cfg: c,
			agent:    with(ready("a", 0, 20, 3), func(a *dispatch.Agent) { a.State = dispatch.StateWarming }),
			eligible: true, effective: 2, free: 0,
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
		name    string
		agents  []dispatch.Agent
		need    dispatch.Need
		r       uint64
		want    dispatch.Route
		wantErr error
		errHas  string
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", tt.agents, t0, dispatch.DefaultConfig())
			got, err := m.Decide(tt.need, tt.r)
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
		})
	}
}

func TestDecideNilModel(t *testing.T) {
	var m *dispatch.Model
	if _, err := m.Decide(dispatch.Need{}, 0); !errors.Is(err, dispatch.ErrNoCapacity) {
		t.Fatalf("nil Model: Decide() error = %v, want ErrNoCapacity", err)
	}
}

// TestSplit is the reference gateway's statistical test, plus the fleet
// where count and capacity part ways. Measured shares go to
// docs/dispatch.md (go test -v -run TestSplit).
func TestSplit(t *testing.T) {
	const n = 10_000
	tests := []struct {
		name                     string
		mode                     dispatch.Mode
		regular, prefill, decode int
		wantPD                   float64
	}{
		{name: "6R 2P 2D count", mode: dispatch.ModeCount, regular: 6, prefill: 2, decode: 2, wantPD: 4.0 / 10},
		{name: "6R 2P 2D paired", mode: dispatch.ModePaired, regular: 6, prefill: 2, decode: 2, wantPD: 4.0 / 10},
		{name: "6R 2P 2D capacity", mode: dispatch.ModeCapacity, regular: 6, prefill: 2, decode: 2, wantPD: 4.0 / 10},
		{name: "6R 10P 1D count", mode: dispatch.ModeCount, regular: 6, prefill: 10, decode: 1, wantPD: 11.0 / 17},
		{name: "6R 10P 1D paired", mode: dispatch.ModePaired, regular: 6, prefill: 10, decode: 1, wantPD: 2.0 / 8},
		{name: "6R 10P 1D capacity", mode: dispatch.ModeCapacity, regular: 6, prefill: 10, decode: 1, wantPD: 2.0 / 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", pools(tt.regular, tt.prefill, tt.decode, 8), t0, cfg(tt.mode))
			rng := rand.New(rand.NewPCG(1, 2))
			pd := 0
			for range n {
				route, err := m.Decide(dispatch.Need{}, rng.Uint64())
				if err != nil {
					t.Fatal(err)
				}
				if route == dispatch.RoutePD {
					pd++
				}
			}
			got := float64(pd) / n
			t.Logf("PD share %.4f, want %.4f, error %+.4f", got, tt.wantPD, got-tt.wantPD)
			if math.Abs(got-tt.wantPD) > 0.02 {
				t.Errorf("PD share %.4f over %d decisions, want %.4f ± 0.02", got, n, tt.wantPD)
			}
		})
	}
}

func TestDecideAllocs(t *testing.T) {
	both := dispatch.NewModel("m", pools(6, 2, 2, 8), t0, dispatch.DefaultConfig())
	pdOnly := dispatch.NewModel("m", pools(0, 2, 2, 8), t0, dispatch.DefaultConfig())
	none := dispatch.NewModel("m", nil, t0, dispatch.DefaultConfig())
	tests := []struct {
		name  string
		m     *dispatch.Model
		need  dispatch.Need
		r     uint64
		limit float64
	}{
		{name: "pd", m: both, r: 0},
		{name: "regular", m: both, r: math.MaxUint64},
		{name: "NoPD regular", m: both, need: dispatch.Need{NoPD: true, Reason: "n > 1"}},
		{name: "ErrNoCapacity", m: none},
		{name: "ErrNoCapacity NoPD", m: none, need: dispatch.Need{NoPD: true, Reason: "n > 1"}},
		{name: "ErrUnsupported without reason", m: pdOnly, need: dispatch.Need{NoPD: true}},
		// The reason is the caller's string: carrying it costs one struct.
		{name: "ErrUnsupported with reason", m: pdOnly, need: dispatch.Need{NoPD: true, Reason: "n > 1"}, limit: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sink error
			allocs := testing.AllocsPerRun(1000, func() {
				_, sink = tt.m.Decide(tt.need, tt.r)
			})
			_ = sink
			if allocs > tt.limit {
				t.Errorf("Decide allocates %v times, want at most %v", allocs, tt.limit)
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
		{Pool: R, Agents: 2, Eligible: 1, Slots: 8, EffectiveSlots: 8, Active: 3, Free: 5},
		{Pool: P, Agents: 1, Eligible: 1, Slots: 20, EffectiveSlots: 2, Active: 1, Free: 1},
		{Pool: D, Agents: 1, Eligible: 1, Slots: 4, EffectiveSlots: 4, Active: 6, Free: 0},
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
