package dispatch_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// timed returns a with the learned timing t, sampled at t0.
func timed(a dispatch.Agent, t dispatch.Timing) dispatch.Agent {
	if t.Samples == 0 {
		t.Samples = 50
	}
	if t.Updated.IsZero() {
		t.Updated = t0
	}
	a.Timing = t
	return a
}

// The learned figures of sloFleet: a regular engine whose prefill shares
// its steps with running decodes, streaming 32 tokens a request; a
// dedicated prefill engine 2.5 times as fast; a PD hop (decode queue, KV
// transfer, first step) of 120ms and a decode engine whose bigger batches
// take 16ms a token.
var (
	regularTiming = dispatch.Timing{ITL: 15 * time.Millisecond, TTFT: 40 * time.Millisecond, PrefillRate: 40_000, OutputTokens: 32}
	prefillTiming = dispatch.Timing{QueueWait: 30 * time.Millisecond, TTFT: 60 * time.Millisecond, PrefillRate: 100_000}
	decodeTiming  = dispatch.Timing{TTFT: 120 * time.Millisecond, ITL: 16 * time.Millisecond, OutputTokens: 32}
)

// sloFleet: one regular agent running 4 requests, one prefill agent and
// one decode agent running 2, all with 8 slots and learned timing.
func sloFleet() []dispatch.Agent {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	return []dispatch.Agent{
		timed(ready("r1", R, 8, 4), regularTiming),
		timed(ready("p1", P, 8, 0), prefillTiming),
		timed(ready("d1", D, 8, 2), decodeTiming),
	}
}

// cache is a fake PrefixCache: cached tokens per pool and pairing.
type cache map[poolPair]int

func (c cache) Cached(pool dispatch.Pool, pair string) int { return c[poolPair{pool, pair}] }

var _ dispatch.PrefixCache = cache(nil)

// sloTargets are interactive targets: 250ms to the first token, 20ms per
// output token.
var sloTargets = dispatch.Targets{TTFT: 250 * time.Millisecond, ITL: 20 * time.Millisecond}

func sloConfig() dispatch.Config {
	c := dispatch.DefaultConfig()
	c.Mode = dispatch.ModeSLO
	return c
}

func TestSLO(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	long := dispatch.Need{PromptTokens: 8000, Targets: sloTargets}
	short := dispatch.Need{PromptTokens: 256, Targets: sloTargets}
	cachedOnRegular := long
	cachedOnRegular.Cache = cache{{R, ""}: 7900}
	congested := sloFleet()
	congested[1].Timing.QueueWait = 2 * time.Second
	tests := []struct {
		name   string
		agents []dispatch.Agent
		need   dispatch.Need
		seen   dispatch.InFlight
		want   string // destination
		// pred is the prediction for the chosen route, if checked.
		pred *dispatch.Prediction
	}{
		{
			// Regular: TTFT 200ms meets its target, but the 200ms prefill
			// delays each running decode's 32 tokens by 6.25ms a token,
			// past the 20ms target (headroom -0.0625). PD: 30ms queue +
			// 80ms prefill + 120ms hop = 230ms, decode ITL 16ms (headroom
			// 0.08).
			name: "long uncached prompt goes PD when regular decodes would miss their ITL target",
			need: long, want: "pd vllm",
			pred: &dispatch.Prediction{TTFT: 230 * time.Millisecond, ITL: 16 * time.Millisecond, Headroom: 0.08},
		},
		{
			// Regular: TTFT 6.4ms, ITL 15.2ms (headroom 0.24). PD: TTFT
			// 152.56ms, ITL 16ms (headroom 0.2).
			name: "short prompt stays regular", need: short, want: "regular",
			pred: &dispatch.Prediction{TTFT: 6400 * time.Microsecond, ITL: 15_200 * time.Microsecond, Headroom: 0.24},
		},
		{
			name: "long prompt cached on regular stays regular", need: cachedOnRegular, want: "regular",
			pred: &dispatch.Prediction{TTFT: 2500 * time.Microsecond, ITL: 15_078_125 * time.Nanosecond, Headroom: 0.24609375},
		},
		{
			name: "long prompt cached on prefill goes PD", want: "pd vllm",
			need: dispatch.Need{PromptTokens: 8000, Targets: sloTargets, Cache: cache{{P, "vllm"}: 7000}},
		},
		{
			// PD misses by 2s of queue (headroom -7.8), regular by its ITL
			// (-0.0625): regular misses least.
			name: "congested prefill pool sends work to regular", agents: congested, need: long, want: "regular",
		},
		{
			name: "idle regular pool: no decodes to stall, TTFT decides", need: dispatch.Need{PromptTokens: 2000, Targets: sloTargets},
			agents: []dispatch.Agent{
				timed(ready("r1", R, 8, 0), regularTiming),
				timed(ready("p1", P, 8, 0), prefillTiming),
				timed(ready("d1", D, 8, 2), decodeTiming),
			},
			want: "regular",
			pred: &dispatch.Prediction{TTFT: 50 * time.Millisecond, ITL: 15 * time.Millisecond, Headroom: 0.25},
		},
		{
			name: "running decodes seen between heartbeats stall like reported ones", need: dispatch.Need{PromptTokens: 2000, Targets: sloTargets},
			agents: []dispatch.Agent{
				timed(ready("r1", R, 8, 0), regularTiming),
				timed(ready("p1", P, 8, 0), prefillTiming),
				timed(ready("d1", D, 8, 2), decodeTiming),
			},
			seen: inflight{{R, ""}: {active: 3}},
			want: "pd vllm",
		},
		{
			name: "ITL target only", need: dispatch.Need{PromptTokens: 8000, Targets: dispatch.Targets{ITL: 20 * time.Millisecond}},
			want: "pd vllm",
		},
		{
			name: "TTFT target only: the regular prefill is slower, but the hop costs more", want: "regular",
			need: dispatch.Need{PromptTokens: 1000, Targets: dispatch.Targets{TTFT: time.Second}},
		},
		// Capacity is the frame.
		{
			name: "full decode pool is never chosen", need: long, want: "regular",
			agents: []dispatch.Agent{
				timed(ready("r1", R, 8, 4), regularTiming),
				timed(ready("p1", P, 8, 0), prefillTiming),
				timed(ready("d1", D, 8, 8), decodeTiming),
			},
		},
		{
			name: "decode pool filled by what the broker sent is never chosen", need: long, want: "regular",
			seen: inflight{{D, "vllm"}: {pending: 6}},
		},
		{
			name: "full prefill pool is never chosen", need: long, want: "regular",
			seen: inflight{{P, "vllm"}: {pending: 8}},
		},
		{
			name: "full regular pool is never chosen", need: short, want: "pd vllm",
			seen: inflight{{R, ""}: {active: 8}},
		},
		{
			name: "slow start holds: a new decode agent's one slot taken, PD is full", need: long, want: "regular",
			agents: []dispatch.Agent{
				timed(ready("r1", R, 8, 4), regularTiming),
				timed(ready("p1", P, 8, 0), prefillTiming),
				with(timed(ready("d1", D, 8, 0), decodeTiming), func(a *dispatch.Agent) { a.ReadySince = t0 }),
			},
			seen: inflight{{D, "vllm"}: {pending: 1}},
		},
		{
			name: "a warming pairing is never chosen", need: long, want: "regular",
			agents: []dispatch.Agent{
				timed(ready("r1", R, 8, 4), regularTiming),
				timed(warming(ready("p1", P, 8, 0)), prefillTiming),
				timed(warming(ready("d1", D, 8, 0)), decodeTiming),
			},
		},
		{
			name: "two pairings: the one without a queue", need: long, want: "pd sglang+kv=mooncake",
			agents: []dispatch.Agent{
				timed(ready("r1", R, 8, 4), regularTiming),
				timed(ready("p1", P, 8, 0), dispatch.Timing{QueueWait: time.Second, PrefillRate: 100_000}),
				timed(ready("d1", D, 8, 0), decodeTiming),
				timed(mooncake(ready("p2", P, 8, 0)), prefillTiming),
				timed(mooncake(ready("d2", D, 8, 0)), decodeTiming),
			},
		},
		{
			name: "figures are weighted by effective slots", need: long, want: "pd vllm",
			agents: []dispatch.Agent{
				timed(ready("r1", R, 8, 4), regularTiming),
				// A congested prefill agent with 1 slot beside an idle one
				// with 15: the pool waits 1/16 of its queue.
				timed(ready("p1", P, 1, 0), dispatch.Timing{QueueWait: 640 * time.Millisecond, PrefillRate: 100_000}),
				timed(ready("p2", P, 15, 0), dispatch.Timing{PrefillRate: 100_000}),
				timed(ready("d1", D, 8, 2), decodeTiming),
			},
			pred: &dispatch.Prediction{TTFT: 240 * time.Millisecond, ITL: 16 * time.Millisecond, Headroom: 0.04},
		},
		{
			name: "agents without figures do not dilute their pool's", need: long, want: "pd vllm",
			agents: append(sloFleet(), ready("p2", P, 8, 0), ready("d2", D, 8, 0)),
			pred:   &dispatch.Prediction{TTFT: 230 * time.Millisecond, ITL: 16 * time.Millisecond, Headroom: 0.08},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agents := tt.agents
			if agents == nil {
				agents = sloFleet()
			}
			m := dispatch.NewModel("m", agents, t0, sloConfig())
			// Both ends of the random number: the choice must not depend
			// on it.
			for _, r := range []uint64{0, math.MaxUint64} {
				d, err := m.Decide(tt.need, tt.seen, r)
				if err != nil {
					t.Fatalf("Decide() error = %v", err)
				}
				if got := destination(d); got != tt.want {
					t.Fatalf("Decide(r=%#x) = %s, want %s (prediction %+v)", r, got, tt.want, d.Prediction)
				}
				if !d.Predicted {
					t.Errorf("Decide(r=%#x).Predicted = false, want a decision by prediction", r)
				}
				if p := tt.pred; p != nil && !near(d.Prediction, *p) {
					t.Errorf("Decide(r=%#x).Prediction = %+v, want %+v", r, d.Prediction, *p)
				}
			}
		})
	}
}

func mooncake(a dispatch.Agent) dispatch.Agent {
	a.PDProtocol, a.PDLabels = "sglang", "kv=mooncake"
	return a
}

// near compares predictions to the microsecond and headroom to 1e-6.
func near(a, b dispatch.Prediction) bool {
	return (a.TTFT-b.TTFT).Abs() <= time.Microsecond && (a.ITL-b.ITL).Abs() <= time.Microsecond &&
		math.Abs(a.Headroom-b.Headroom) < 1e-6
}

// A prompt's prefill delays the regular pool's running streams by its
// prefill time in all, spread over the tokens they stream: the shorter
// their answers, the more it adds to their time per output token.
func TestSLOStallSpreadOverOutput(t *testing.T) {
	R := dispatch.PoolRegular
	need := dispatch.Need{PromptTokens: 8000, Targets: sloTargets}
	for _, tt := range []struct {
		out  float64
		want time.Duration // predicted ITL: 15ms + 200ms / out
	}{
		{out: 32, want: 21_250 * time.Microsecond},
		{out: 200, want: 16 * time.Millisecond},
		{out: 1, want: 215 * time.Millisecond},
	} {
		t.Run(fmt.Sprint(tt.out), func(t *testing.T) {
			tm := regularTiming
			tm.OutputTokens = tt.out
			m := dispatch.NewModel("m", []dispatch.Agent{timed(ready("r1", R, 8, 1), tm)}, t0, sloConfig())
			d, err := m.Decide(need, nil, 0)
			if err != nil || !d.Predicted {
				t.Fatalf("Decide() = %+v, %v; want a prediction", d, err)
			}
			if (d.Prediction.ITL - tt.want).Abs() > time.Microsecond {
				t.Errorf("predicted ITL = %v, want %v", d.Prediction.ITL, tt.want)
			}
		})
	}
}

// Without targets, prompt length or history, slo decides exactly as
// capacity does, for every random number and whatever the broker saw.
func TestSLOFallsBackToCapacity(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	old := sloFleet()
	for i := range old {
		old[i].Timing.Updated = t0.Add(-dispatch.DefaultTimingMaxAge)
	}
	noRate := sloFleet()
	noRate[0].Timing.PrefillRate = 0
	noOutput := sloFleet()
	noOutput[0].Timing.OutputTokens = 0
	full := inflight{{R, ""}: {active: 8}, {D, "vllm"}: {pending: 6}}
	unreported := sloFleet()
	unreported[0].Timing.PrefillRate, unreported[0].Timing.CacheUnreported = 0, true
	need := dispatch.Need{PromptTokens: 8000, Targets: sloTargets}
	guard := need
	guard.Guard = true
	tests := []struct {
		name     string
		agents   []dispatch.Agent
		need     dispatch.Need
		seen     dispatch.InFlight
		fallback string
	}{
		{name: "no targets", need: dispatch.Need{PromptTokens: 8000}, fallback: dispatch.FallbackNoTargets},
		{name: "no targets, seen", need: dispatch.Need{PromptTokens: 8000}, seen: inflight{{R, ""}: {pending: 2}}, fallback: dispatch.FallbackNoTargets},
		{name: "no prompt length", need: dispatch.Need{Targets: sloTargets}, fallback: dispatch.FallbackNoTargets},
		{name: "no history", agents: twoPairings(), need: need, fallback: dispatch.FallbackNoHistory},
		{
			name: "one pool without history", need: need, fallback: dispatch.FallbackNoHistory,
			agents: []dispatch.Agent{timed(ready("r1", R, 8, 4), regularTiming), timed(ready("p1", P, 8, 0), prefillTiming), ready("d1", D, 8, 2)},
		},
		{name: "figures past their max age", agents: old, need: need, fallback: dispatch.FallbackNoHistory},
		{name: "regular without a prefill rate", agents: noRate, need: need, fallback: dispatch.FallbackNoHistory},
		{name: "regular without an output length", agents: noOutput, need: need, fallback: dispatch.FallbackNoHistory},
		{name: "engines report no cached tokens", agents: unreported, need: need, fallback: dispatch.FallbackUnreported},
		{name: "predictions off", need: guard, fallback: dispatch.FallbackGuard},
		{name: "every route full", need: need, seen: full},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agents := tt.agents
			if agents == nil {
				agents = sloFleet()
			}
			slo := dispatch.NewModel("m", agents, t0, sloConfig())
			capacity := dispatch.NewModel("m", agents, t0, dispatch.DefaultConfig())
			routes := map[string]int{}
			for i := range 64 {
				r := uint64(i) * (math.MaxUint64 / 63)
				got, err := slo.Decide(tt.need, tt.seen, r)
				want, wantErr := capacity.Decide(tt.need, tt.seen, r)
				if got.Fallback != tt.fallback {
					t.Fatalf("fallback %q, want %q", got.Fallback, tt.fallback)
				}
				want.Fallback = tt.fallback
				if tt.fallback == dispatch.FallbackGuard {
					// What slo predicts for capacity's choice, to be scored.
					if got.Prediction.TTFT <= 0 {
						t.Fatalf("no prediction scored under the guard: %+v", got)
					}
					want.Prediction = got.Prediction
				}
				if got != want || err != wantErr {
					t.Fatalf("r=%#x: slo Decide() = %+v, %v; capacity %+v, %v", r, got, err, want, wantErr)
				}
				routes[destination(got)]++
			}
			if len(routes) < 2 {
				t.Errorf("routes %v: the fleet should give both routes some weight", routes)
			}
		})
	}
}

// A request PD cannot serve goes regular in slo mode too, even when PD
// would be predicted better.
func TestSLONoPD(t *testing.T) {
	m := dispatch.NewModel("m", sloFleet(), t0, sloConfig())
	d, err := m.Decide(dispatch.Need{NoPD: true, PromptTokens: 8000, Targets: sloTargets}, nil, 0)
	if err != nil || d.Route != dispatch.RouteRegular {
		t.Fatalf("Decide() = %+v, %v; want regular", d, err)
	}
}

func TestThreshold(t *testing.T) {
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	c := dispatch.DefaultConfig()
	c.Mode = dispatch.ModeThreshold
	c.PDThreshold = 1000
	prompt := func(n int, cached cache) dispatch.Need {
		return dispatch.Need{PromptTokens: n, Cache: cached}
	}
	tests := []struct {
		name   string
		agents []dispatch.Agent
		need   dispatch.Need
		seen   dispatch.InFlight
		want   string
	}{
		{name: "above the threshold goes PD", need: prompt(1001, nil), want: "pd vllm"},
		{name: "at the threshold stays regular", need: prompt(1000, nil), want: "regular"},
		{name: "short stays regular", need: prompt(10, nil), want: "regular"},
		{name: "long but cached on regular stays regular", need: prompt(8000, cache{{R, ""}: 7500}), want: "regular"},
		{name: "cached on prefill does not count", need: prompt(8000, cache{{P, "vllm"}: 8000}), want: "pd vllm"},
		{name: "cached beyond the prompt counts as the prompt", need: prompt(8000, cache{{R, ""}: 9000}), want: "regular"},
		{name: "long, PD full: regular", need: prompt(8000, nil), seen: inflight{{D, "vllm"}: {pending: 8}}, want: "regular"},
		{name: "short, regular full: PD", need: prompt(10, nil), seen: inflight{{R, ""}: {pending: 8}}, want: "pd vllm"},
		{name: "long, both full: PD by the fall-back", need: prompt(8000, nil), seen: inflight{{R, ""}: {pending: 8}, {D, "vllm"}: {pending: 8}}, want: "pd vllm"},
		{name: "short, both full: regular by the fall-back", need: prompt(10, nil), seen: inflight{{R, ""}: {pending: 8}, {D, "vllm"}: {pending: 8}}, want: "regular"},
		{name: "short without regular: PD", agents: pools(0, 1, 1, 8), need: prompt(10, nil), want: "pd vllm"},
		{name: "long without PD: regular", agents: pools(1, 0, 1, 8), need: prompt(8000, nil), want: "regular"},
		{name: "long without PD, regular full: regular", agents: pools(1, 0, 1, 8), need: prompt(8000, nil), seen: inflight{{R, ""}: {pending: 8}}, want: "regular"},
		{
			name: "long: the pairing with room", need: prompt(8000, nil), seen: inflight{{D, "vllm"}: {pending: 8}}, want: "pd sglang+kv=mooncake",
			agents: twoPairings(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agents := tt.agents
			if agents == nil {
				agents = pools(1, 1, 1, 8)
			}
			m := dispatch.NewModel("m", agents, t0, c)
			for _, r := range []uint64{0, math.MaxUint64} {
				d, err := m.Decide(tt.need, tt.seen, r)
				if err != nil {
					t.Fatalf("Decide() error = %v", err)
				}
				if got := destination(d); got != tt.want {
					t.Fatalf("Decide(r=%#x) = %s, want %s", r, got, tt.want)
				}
				if d.Predicted {
					t.Errorf("Decide(r=%#x).Predicted = true in threshold mode", r)
				}
			}
		})
	}

	// Without a prompt length, threshold weighs by capacity.
	m := dispatch.NewModel("m", pools(6, 2, 2, 8), t0, c)
	capacity := dispatch.NewModel("m", pools(6, 2, 2, 8), t0, dispatch.DefaultConfig())
	for _, r := range []uint64{0, 1 << 62, 1 << 63, math.MaxUint64} {
		got, _ := m.Decide(dispatch.Need{}, nil, r)
		want, _ := capacity.Decide(dispatch.Need{}, nil, r)
		if got != want {
			t.Errorf("no prompt length, r=%#x: threshold Decide() = %+v, capacity %+v", r, got, want)
		}
	}
}

// Prefill work sent to a route counts in its prediction at once: four
// requests of 4,000 prefilled tokens each held by the prefill pool add
// 4 × 4,000 / 100,000 tokens/s = 160ms to PD's predicted TTFT, which
// then misses the target by more than regular does.
func TestSLOQueuedPrefillWork(t *testing.T) {
	P := dispatch.PoolPrefill
	agents := sloFleet()
	agents[1].Timing.PrefillTokens = 4000
	m := dispatch.NewModel("m", agents, t0, sloConfig())
	long := dispatch.Need{PromptTokens: 8000, Targets: sloTargets}
	idle, err := m.Decide(long, inflight{}, 0)
	if err != nil || idle.Route != dispatch.RoutePD || !idle.Predicted {
		t.Fatalf("at rest: Decide() = %+v, %v; want PD", idle, err)
	}
	if want := 230 * time.Millisecond; (idle.Prediction.TTFT - want).Abs() > time.Microsecond {
		t.Fatalf("at rest: predicted TTFT %v, want %v", idle.Prediction.TTFT, want)
	}
	busy, err := m.Decide(long, inflight{{P, "vllm"}: {active: 4}}, 0)
	if err != nil || busy.Route != dispatch.RouteRegular {
		t.Fatalf("with 4 prefills queued: Decide() = %+v, %v; want regular", busy, err)
	}
	// What slo predicts for PD now, as the guard would score it.
	guard := long
	guard.Guard = true
	for r := uint64(0); r < 64; r++ {
		d, _ := m.Decide(guard, inflight{{P, "vllm"}: {active: 4}}, r*(math.MaxUint64/63))
		if d.Route != dispatch.RoutePD {
			continue
		}
		if want := 390 * time.Millisecond; (d.Prediction.TTFT - want).Abs() > time.Microsecond {
			t.Fatalf("with 4 prefills queued: PD predicted TTFT %v, want %v", d.Prediction.TTFT, want)
		}
		return
	}
	t.Fatal("capacity never chose PD")
}

// Prefill work the regular agents already hold (Timing.InPrefill: taken,
// no first token yet; or Agent.EngineWaiting, the requests waiting in the
// engine as its heartbeat reports them) is queued ahead of a new request
// in their engine:
// a short prompt's predicted TTFT on regular grows by InPrefill ×
// PrefillTokens / agents / PrefillRate, here 3 × 4,000 / 40,000 tokens/s =
// 300ms, past the target, so it goes PD.
func TestSLOInPrefillWork(t *testing.T) {
	agents := sloFleet()
	agents[0].Timing.PrefillTokens = 4000
	short := dispatch.Need{PromptTokens: 400, Targets: sloTargets}
	m := dispatch.NewModel("m", agents, t0, sloConfig())
	idle, err := m.Decide(short, inflight{}, 0)
	if err != nil || idle.Route != dispatch.RouteRegular || !idle.Predicted {
		t.Fatalf("nothing in prefill: Decide() = %+v, %v; want regular", idle, err)
	}
	if want := 10 * time.Millisecond; (idle.Prediction.TTFT - want).Abs() > time.Microsecond {
		t.Fatalf("nothing in prefill: predicted TTFT %v, want %v", idle.Prediction.TTFT, want)
	}
	// Three waiting in the engine as its heartbeat reports them (other
	// brokers' requests, say) weigh the same; the larger count stands.
	agents[0].EngineWaiting = 3
	m = dispatch.NewModel("m", agents, t0, sloConfig())
	if d, err := m.Decide(short, inflight{}, 0); err != nil || d.Route != dispatch.RoutePD {
		t.Fatalf("3 waiting in the engine: Decide() = %+v, %v; want PD", d, err)
	}
	agents[0].EngineWaiting = 0
	agents[0].Timing.InPrefill = 3
	m = dispatch.NewModel("m", agents, t0, sloConfig())
	busy, err := m.Decide(short, inflight{}, 0)
	if err != nil || busy.Route != dispatch.RoutePD {
		t.Fatalf("3 in prefill: Decide() = %+v, %v; want PD", busy, err)
	}
	guard := short
	guard.Guard = true
	for r := uint64(0); r < 64; r++ {
		d, _ := m.Decide(guard, inflight{}, r*(math.MaxUint64/63))
		if d.Route != dispatch.RouteRegular {
			continue
		}
		if want := 310 * time.Millisecond; (d.Prediction.TTFT - want).Abs() > time.Microsecond {
			t.Fatalf("3 in prefill: regular predicted TTFT %v, want %v", d.Prediction.TTFT, want)
		}
		return
	}
	t.Fatal("capacity never chose regular")
}
