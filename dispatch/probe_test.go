package dispatch_test

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// probeFleet is sloFleet with its PD figures learned age ago: a short
// prompt is predicted to regular, so PD gets no new samples.
func probeFleet(age time.Duration) []dispatch.Agent {
	a := sloFleet()
	a[1].Timing.Updated = t0.Add(-age)
	a[2].Timing.Updated = t0.Add(-age)
	return a
}

// probeDraws decides need for every value of the low 11 bits of the
// random number (the probe's draw), with both ends of the top bits (the
// route's draw), and returns how many of the decisions were probes and
// where they went.
func probeDraws(t *testing.T, m *dispatch.Model, need dispatch.Need, seen dispatch.InFlight) (probes int, dest map[string]int) {
	t.Helper()
	dest = map[string]int{}
	for _, top := range []uint64{0, math.MaxUint64 &^ (1<<11 - 1)} {
		for low := uint64(0); low < 1<<11; low++ {
			d, err := m.Decide(need, seen, top|low)
			if err != nil {
				t.Fatalf("Decide(%d): %v", top|low, err)
			}
			if d.Probe {
				probes++
				dest[destination(d)]++
				if !d.Predicted || d.Prediction.TTFT <= 0 || d.Fallback != "" {
					t.Errorf("probe decision %+v: want a prediction for the probed route and no fallback", d)
				}
			}
		}
	}
	return probes, dest
}

func TestSLOProbe(t *testing.T) {
	D := dispatch.PoolDecode
	short := dispatch.Need{PromptTokens: 256, Targets: sloTargets}
	long := dispatch.Need{PromptTokens: 4000, Targets: sloTargets}
	few := sloFleet()
	few[2].Timing.Samples = 3
	everyTenth := sloConfig()
	everyTenth.ProbeShare = 0.1
	off := sloConfig()
	off.ProbeShare = 0
	cheap := sloConfig()
	cheap.ProbeTokens = 100
	tests := []struct {
		name   string
		agents []dispatch.Agent
		cfg    dispatch.Config
		need   dispatch.Need
		seen   dispatch.InFlight
		// probes is the number of probes among the 4096 draws: the share
		// in 2048ths, twice.
		probes int
	}{
		{name: "stale PD at the default share", agents: probeFleet(20 * time.Second), cfg: sloConfig(), need: short, probes: 2 * 41},
		{name: "stale PD at a share of 1/10", agents: probeFleet(20 * time.Second), cfg: everyTenth, need: short, probes: 2 * 205},
		{name: "few samples on PD's decode leg", agents: few, cfg: sloConfig(), need: short, probes: 2 * 41},
		{name: "fresh figures", agents: probeFleet(10 * time.Second), cfg: sloConfig(), need: short},
		{name: "probes off", agents: probeFleet(20 * time.Second), cfg: off, need: short},
		{name: "stale PD, some load seen", agents: probeFleet(20 * time.Second), cfg: sloConfig(), need: short, seen: inflight{{dispatch.PoolRegular, ""}: {pending: 1}, {D, "vllm"}: {active: 2}}, probes: 2 * 41},
		{name: "PD full", agents: probeFleet(20 * time.Second), cfg: sloConfig(), need: short, seen: inflight{{D, "vllm"}: {pending: 6}}},
		{name: "no targets", agents: probeFleet(20 * time.Second), cfg: sloConfig(), need: dispatch.Need{PromptTokens: 256}},
		{name: "no prompt length", agents: probeFleet(20 * time.Second), cfg: sloConfig(), need: dispatch.Need{Targets: sloTargets}},
		{name: "prompt too long to be cheap", agents: probeFleet(20 * time.Second), cfg: cheap, need: short},
		{name: "rate bound holds", agents: probeFleet(20 * time.Second), cfg: sloConfig(), need: dispatch.Need{PromptTokens: 256, Targets: sloTargets, NoProbe: true}},
		{name: "guard holds", agents: probeFleet(20 * time.Second), cfg: sloConfig(), need: dispatch.Need{PromptTokens: 256, Targets: sloTargets, Guard: true}},
		{name: "capacity mode", agents: probeFleet(20 * time.Second), cfg: dispatch.DefaultConfig(), need: short},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := dispatch.NewModel("m", tt.agents, t0, tt.cfg)
			probes, dest := probeDraws(t, m, tt.need, tt.seen)
			if probes != tt.probes {
				t.Errorf("%d probes in 4096 decisions, want %d", probes, tt.probes)
			}
			if probes > 0 && dest["pd vllm"] != probes {
				t.Errorf("probes went to %v, want all to the stale route pd vllm", dest)
			}
		})
	}

	// The stale route is the one slo avoids: where the predictions choose
	// it anyway (a long prompt goes PD), nothing is probed, the fresh
	// regular route included.
	m := dispatch.NewModel("m", probeFleet(20*time.Second), t0, sloConfig())
	if probes, _ := probeDraws(t, m, long, nil); probes != 0 {
		t.Errorf("long prompt: %d probes, want 0", probes)
	}
	if d, _ := m.Decide(long, nil, 0); destination(d) != "pd vllm" || d.Probe {
		t.Errorf("long prompt decided %+v, want pd vllm by prediction", d)
	}
	// Without a probe, the short prompt goes to regular: the probe is
	// what sends it to PD.
	if d, _ := m.Decide(short, nil, 1<<11-1); destination(d) != "regular" || d.Probe {
		t.Errorf("short prompt decided %+v, want regular by prediction", d)
	}
}

func TestConfigProbeValidate(t *testing.T) {
	for _, c := range []func(*dispatch.Config){
		func(c *dispatch.Config) { c.ProbeShare = -0.1 },
		func(c *dispatch.Config) { c.ProbeShare = 1.5 },
		func(c *dispatch.Config) { c.ProbeShare = math.NaN() },
		func(c *dispatch.Config) { c.ProbeAge = -time.Second },
		func(c *dispatch.Config) { c.ProbeSamples = -1 },
		func(c *dispatch.Config) { c.ProbeTokens = -1 },
	} {
		cfg := sloConfig()
		c(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", cfg)
		}
	}
	if err := sloConfig().Validate(); err != nil {
		t.Errorf("default slo config: %v", err)
	}
}
