package broker

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// probeGap bounds slo's probes (dispatch.Config.ProbeShare) by rate as
// well as by share: at most one per model in each probeGap, so that a
// burst of traffic does not turn its share into a burst of requests on a
// route the predictions avoid.
const probeGap = 100 * time.Millisecond

// modelProbes is one model's probes: when the last one was sent, and how
// many went to each route.
type modelProbes struct {
	last     atomic.Int64 // unix nanos; 0: none yet
	counters [dispatch.RoutePD + 1]prometheus.Counter
	sent     [dispatch.RoutePD + 1]atomic.Uint64
}

// probes returns model's probe state.
func (b *Broker) probes(model string) *modelProbes {
	if v, ok := b.guard.probes.Load(model); ok {
		return v.(*modelProbes)
	}
	p := &modelProbes{}
	for r := range p.counters {
		p.counters[r] = b.metrics.sloProbes.WithLabelValues(model, dispatch.Route(r).String())
	}
	v, _ := b.guard.probes.LoadOrStore(model, p)
	return v.(*modelProbes)
}

// probeHeld reports whether model had a probe less than probeGap ago:
// its next request must not be one (dispatch.Need.NoProbe). Concurrent
// decisions may each send one past the bound, a handful at most.
func (b *Broker) probeHeld(model string, now time.Time) bool {
	last := b.probes(model).last.Load()
	return last != 0 && now.UnixNano()-last < int64(probeGap)
}

// probed counts a probe to model's route.
func (b *Broker) probed(model string, route dispatch.Route, now time.Time) {
	if route > dispatch.RoutePD {
		return
	}
	p := b.probes(model)
	p.last.Store(now.UnixNano())
	p.counters[route].Inc()
	p.sent[route].Add(1)
}

// SLOProbes returns how many probes slo sent to model's route.
func (b *Broker) SLOProbes(model string, route dispatch.Route) uint64 {
	if route > dispatch.RoutePD {
		return 0
	}
	v, ok := b.guard.probes.Load(model)
	if !ok {
		return 0
	}
	return v.(*modelProbes).sent[route].Load()
}
