package dispatch_test

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// dispatched is what a broker counts between heartbeats: jobs it sent to
// the regular queue that no agent has taken yet.
type dispatched struct{ regular int }

func (d dispatched) Outstanding(pool dispatch.Pool, pair string) (pending, active int) {
	if pool == dispatch.PoolRegular {
		return d.regular, 0
	}
	return 0, 0
}

func ExampleModel_Decide() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	agent := func(id string, pool dispatch.Pool, active int) dispatch.Agent {
		a := dispatch.Agent{
			ID: id, Pool: pool, State: dispatch.StateReady,
			Slots: 8, Active: active,
			ReadySince: now.Add(-time.Hour), LastSeen: now, Interval: time.Second,
		}
		if pool != dispatch.PoolRegular {
			a.PDProtocol = "vllm"
		}
		return a
	}
	// A second decode agent whose engine is still loading its weights: it
	// pulls no jobs, so it counts zero.
	loading := agent("d2", dispatch.PoolDecode, 0)
	loading.State, loading.StateReason = dispatch.StateWarming, "engine not healthy yet: loading weights"
	// 2 regular agents with 10 free slots between them; 2 prefill agents
	// (13 free) and 1 ready decode agent (3 free) of the vllm pairing. A PD
	// request holds a decode slot for its whole life, so PD weighs 3.
	m := dispatch.NewModel("llama", []dispatch.Agent{
		agent("r1", dispatch.PoolRegular, 2),
		agent("r2", dispatch.PoolRegular, 4),
		agent("p1", dispatch.PoolPrefill, 0),
		agent("p2", dispatch.PoolPrefill, 3),
		agent("d1", dispatch.PoolDecode, 5),
		loading,
	}, now, dispatch.DefaultConfig())

	regular, pd := m.Weights()
	fmt.Printf("weights: regular %v, pd %v (pd share %.0f%%)\n", regular, pd, 100*pd/(regular+pd))
	for _, v := range m.Agents() {
		if !v.Eligible {
			fmt.Printf("%s counts zero: %s\n", v.ID, v.Reason)
		}
	}

	// r is the caller's random number; here two fixed values show both ends.
	for _, r := range []uint64{0, math.MaxUint64} {
		d, _ := m.Decide(dispatch.Need{}, nil, r)
		fmt.Printf("route: %v %q\n", d.Route, d.Pair)
	}

	// The broker has sent 10 regular jobs since the last heartbeats and no
	// agent took them yet: regular is full until they are taken.
	seen := dispatched{regular: 10}
	regular, pairs, _ := m.LiveWeights(seen)
	fmt.Printf("with 10 pending: regular %v, pd %q %v\n", regular, pairs[0].Key, pairs[0].Weight)
	d, _ := m.Decide(dispatch.Need{}, seen, math.MaxUint64)
	fmt.Printf("route: %v %q\n", d.Route, d.Pair)

	// A request PD cannot serve goes to regular...
	d, _ = m.Decide(dispatch.Need{NoPD: true, Reason: "n > 1"}, seen, 0)
	fmt.Println("n > 1:", d.Route)

	// ...and fails clearly when there is no regular agent.
	pdOnly := dispatch.NewModel("llama", []dispatch.Agent{
		agent("p1", dispatch.PoolPrefill, 0),
		agent("d1", dispatch.PoolDecode, 0),
	}, now, dispatch.DefaultConfig())
	_, err := pdOnly.Decide(dispatch.Need{NoPD: true, Reason: "n > 1"}, nil, 0)
	fmt.Println(errors.Is(err, dispatch.ErrUnsupported), err)
	// Output:
	// weights: regular 10, pd 3 (pd share 23%)
	// d2 counts zero: warming: engine not healthy yet: loading weights
	// route: pd "vllm"
	// route: regular ""
	// with 10 pending: regular 0, pd "vllm" 3
	// route: pd "vllm"
	// n > 1: regular
	// true dispatch: request not supported by the available route: model "llama" has no eligible regular agent and PD cannot serve this request: n > 1
}

// prefixes is what a broker's prefix-affinity tree says of one request:
// the longest cached prefix on the regular pool and on each pairing's
// prefill pool.
type prefixes struct{ regular, prefill int }

func (p *prefixes) Cached(pool dispatch.Pool, pair string) int {
	if pool == dispatch.PoolRegular {
		return p.regular
	}
	return p.prefill
}

func ExampleModel_Decide_slo() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	agent := func(id string, pool dispatch.Pool, active int, t dispatch.Timing) dispatch.Agent {
		a := dispatch.Agent{
			ID: id, Pool: pool, State: dispatch.StateReady,
			Slots: 8, Active: active,
			ReadySince: now.Add(-time.Hour), LastSeen: now, Interval: time.Second,
		}
		if pool != dispatch.PoolRegular {
			a.PDProtocol = "vllm"
		}
		t.Samples, t.Updated = 100, now
		a.Timing = t
		return a
	}
	ms := time.Millisecond
	cfg := dispatch.DefaultConfig()
	cfg.Mode = dispatch.ModeSLO
	m := dispatch.NewModel("llama", []dispatch.Agent{
		// A regular engine with 4 streams running: 15ms a token, 40k
		// prompt tokens/s of prefill between them, 32-token answers.
		agent("r1", dispatch.PoolRegular, 4, dispatch.Timing{ITL: 15 * ms, PrefillRate: 40_000, OutputTokens: 32}),
		// A prefill engine with a short queue, and a decode engine whose
		// first token comes 120ms after the hand-off, 16ms a token.
		agent("p1", dispatch.PoolPrefill, 0, dispatch.Timing{QueueWait: 30 * ms, PrefillRate: 100_000}),
		agent("d1", dispatch.PoolDecode, 2, dispatch.Timing{TTFT: 120 * ms, ITL: 16 * ms}),
	}, now, cfg)

	targets := dispatch.Targets{TTFT: 250 * ms, ITL: 20 * ms}
	for _, req := range []struct {
		name   string
		prompt int
		cached prefixes
	}{
		{"long prompt", 8000, prefixes{}},
		{"short prompt", 256, prefixes{}},
		{"long prompt, cached on regular", 8000, prefixes{regular: 7900}},
	} {
		d, _ := m.Decide(dispatch.Need{PromptTokens: req.prompt, Cache: &req.cached, Targets: targets}, nil, 0)
		fmt.Printf("%s: %v, predicted TTFT %v, ITL %v, headroom %.2f\n",
			req.name, d.Route, d.Prediction.TTFT.Round(100*time.Microsecond), d.Prediction.ITL.Round(100*time.Microsecond), d.Prediction.Headroom)
	}

	// Without targets the decision is capacity's weighted draw.
	d, _ := m.Decide(dispatch.Need{PromptTokens: 8000}, nil, 0)
	fmt.Println("no targets:", d.Route, d.Predicted)
	// Output:
	// long prompt: pd, predicted TTFT 230ms, ITL 16ms, headroom 0.08
	// short prompt: regular, predicted TTFT 6.4ms, ITL 15.2ms, headroom 0.24
	// long prompt, cached on regular: regular, predicted TTFT 2.5ms, ITL 15.1ms, headroom 0.25
	// no targets: pd false
}
