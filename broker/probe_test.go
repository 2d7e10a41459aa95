package broker

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// learn feeds the broker n samples of agent id's figures, as the timing
// hooks would from its chunks.
func learn(b *Broker, id string, n int, ttft, itl, wait time.Duration, toks, secs, out float64) {
	for range n {
		b.timing.observe(testModel, id, b.now(), true, func(a *agentTiming) {
			a.ttft.add(ttft.Seconds())
			a.itl.add(itl.Seconds())
			a.wait.add(wait.Seconds())
			if toks > 0 {
				a.prefillToks.add(toks)
				a.prefillSecs.add(secs)
			}
			if out > 0 {
				a.output.add(out)
			}
		})
	}
}

// TestSLOProbeThroughSubmit: a short prompt with targets goes to the
// regular route its fresh figures predict, unless the random number draws
// a probe: then it goes to PD, whose figures are drawn from too few
// samples, and the probe is counted in the metric and the fleet's
// prediction stats. Probes are bounded by rate too.
func TestSLOProbeThroughSubmit(t *testing.T) {
	var r64 atomic.Uint64
	r64.Store(1<<11 - 1) // the probe's draw (the low 11 bits) never below the share
	cfg := Config{Targets: Targets{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond}, AcceptTimeout: time.Minute}
	cfg.Dispatch = dispatch.DefaultConfig()
	cfg.Dispatch.Mode = dispatch.ModeSLO
	cfg.Dispatch.SlowStart = 0
	r := newRig(t, cfg, WithRand(r64.Load))
	r.heartbeatIn("r1", subjects.PoolRegular, "", 64)
	r.heartbeatIn("p1", subjects.PoolPrefill, "vllm", 16)
	r.heartbeatIn("d1", subjects.PoolDecode, "vllm", 16)
	r.waitEligible("r1", "p1", "d1")
	ms := time.Millisecond
	learn(r.b, "r1", 50, 40*ms, 15*ms, 0, 1000, 0.025, 32)
	learn(r.b, "p1", 3, 60*ms, 0, 30*ms, 1000, 0.01, 0)
	learn(r.b, "d1", 3, 120*ms, 16*ms, 0, 0, 0, 32)
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		m, ok := r.b.Fleet().Model(testModel)
		if !ok {
			return fmt.Errorf("model not in the table")
		}
		for _, v := range m.Agents() {
			if v.Timing.Samples == 0 {
				return fmt.Errorf("agent %s has no figures in the snapshot", v.ID)
			}
		}
		return nil
	})

	content := strings.Repeat("tell me about the weather in spring ", 20)
	send := func() {
		t.Helper()
		c, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true,
			Body: []byte(`{"model":"m","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":8,"stream":true}`)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
	}
	jobs := func(n uint64) {
		t.Helper()
		testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
			if got := r.streamMsgs(); got != n {
				return fmt.Errorf("%d jobs in the stream, want %d", got, n)
			}
			return nil
		})
	}
	counter := func(route dispatch.Route) float64 {
		var m dto.Metric
		if err := r.b.metrics.sloProbes.WithLabelValues(testModel, route.String()).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}

	for range 5 {
		send()
	}
	jobs(5)
	if got := r.b.SLOProbes(testModel, dispatch.RoutePD) + r.b.SLOProbes(testModel, dispatch.RouteRegular); got != 0 {
		t.Fatalf("%d probes without the probe's draw, want 0", got)
	}
	var fb dto.Metric
	if err := r.b.metrics.sloFallback.WithLabelValues(testModel, dispatch.FallbackNoHistory).Write(&fb); err != nil || fb.GetCounter().GetValue() != 0 {
		t.Fatalf("no_history fallbacks %v (%v): the figures did not reach the decision", fb.GetCounter().GetValue(), err)
	}

	r64.Store(0)
	start := time.Now()
	send()
	jobs(6)
	if got := r.b.SLOProbes(testModel, dispatch.RoutePD); got != 1 {
		t.Fatalf("SLOProbes(pd) = %d, want 1", got)
	}
	if got := counter(dispatch.RoutePD); got != 1 {
		t.Errorf("switchyard_slo_probes_total{route=pd} = %v, want 1", got)
	}
	if got := counter(dispatch.RouteRegular); got != 0 {
		t.Errorf("switchyard_slo_probes_total{route=regular} = %v, want 0", got)
	}
	if ps, _ := r.b.SLOPredictions(testModel, dispatch.RoutePD); ps.Probes != 1 {
		t.Errorf("SLOPredictions(pd).Probes = %d, want 1", ps.Probes)
	}

	// Every draw a probe, sent one after another: the rate bound lets
	// one through per probeGap.
	for range 5 {
		send()
	}
	jobs(11)
	elapsed := time.Since(start)
	if got, most := r.b.SLOProbes(testModel, dispatch.RoutePD), 1+uint64(elapsed/probeGap); got > most {
		t.Errorf("%d probes in %v, want at most %d (one per %v)", got, elapsed, most, probeGap)
	}
}
