package broker

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// The guard over slo dispatch's predictions: per (model, route) the
// relative errors of its last guardWindow predicted TTFTs, and apart
// those of its predicted ITLs (mean time per output token after the
// first). While the median of a route's TTFT or ITL errors exceeds
// guardBound (with at least guardMinSamples of them), the model's
// requests are decided by capacity (dispatch.Need.Guard). Predictions go on being made and scored for the
// routes capacity chooses, so the guard lifts once they are right again.
const (
	guardWindow     = 32
	guardMinSamples = 8
	guardBound      = 0.5
)

// predErrors is one route's recent relative errors, a ring.
type predErrors struct {
	errs [guardWindow]float64
	n    int // how many are set, up to guardWindow
	next int
}

func (p *predErrors) add(e float64) {
	p.errs[p.next] = e
	p.next = (p.next + 1) % guardWindow
	p.n = min(p.n+1, guardWindow)
}

// median returns the median of the recent errors and how many there are.
func (p *predErrors) median() (float64, int) {
	if p.n == 0 {
		return 0, 0
	}
	var buf [guardWindow]float64
	s := buf[:p.n]
	copy(s, p.errs[:p.n])
	slices.Sort(s)
	if p.n%2 == 1 {
		return s[p.n/2], p.n
	}
	return (s[p.n/2-1] + s[p.n/2]) / 2, p.n
}

// guardKey is one scored figure of one route: its TTFT or its ITL.
type guardKey struct {
	obsKey
	itl bool
}

type sloGuard struct {
	mu     sync.Mutex
	routes map[guardKey]*predErrors
	off    map[string]bool // by model: the guard holds
	// fallbacks caches the fallback counter's children by (model,
	// reason): a request without targets counts one, so a label lookup
	// per request is spared.
	fallbacks sync.Map
	// probes is each model's *modelProbes (probe.go).
	probes sync.Map
}

type fallbackKey struct{ model, reason string }

// fallbackCounter returns the counter of model's decisions by capacity
// for reason.
func (b *Broker) fallbackCounter(model, reason string) prometheus.Counter {
	k := fallbackKey{model, reason}
	if v, ok := b.guard.fallbacks.Load(k); ok {
		return v.(prometheus.Counter)
	}
	v, _ := b.guard.fallbacks.LoadOrStore(k, b.metrics.sloFallback.WithLabelValues(model, reason))
	return v.(prometheus.Counter)
}

// scorePrediction records a predicted TTFT against the actual one for model's route.
func (b *Broker) scorePrediction(model string, route dispatch.Route, predicted, actual time.Duration) {
	if predicted <= 0 || actual <= 0 {
		return
	}
	e := (actual - predicted).Abs().Seconds() / actual.Seconds()
	o := b.obs(model, route)
	o.predicted.Observe(predicted.Seconds())
	o.predErr.Observe(e)
	b.guardScore(guardKey{obsKey{model, route}, false}, e)
}

// scoreITLPrediction records a predicted ITL (mean time per output token
// after the first) against the request's actual one on model's route.
func (b *Broker) scoreITLPrediction(model string, route dispatch.Route, predicted, actual time.Duration) {
	if predicted <= 0 || actual <= 0 {
		return
	}
	e := (actual - predicted).Abs().Seconds() / actual.Seconds()
	o := b.obs(model, route)
	o.predictedITL.Observe(predicted.Seconds())
	o.predErrITL.Observe(e)
	b.guardScore(guardKey{obsKey{model, route}, true}, e)
}

// guardScore adds the relative error e to k's ring and sets whether the
// guard holds for k's model.
func (b *Broker) guardScore(k guardKey, e float64) {
	model := k.model
	g := &b.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.routes == nil {
		g.routes = make(map[guardKey]*predErrors)
		g.off = make(map[string]bool)
	}
	p := g.routes[k]
	if p == nil {
		p = new(predErrors)
		g.routes[k] = p
	}
	p.add(e)
	off := false
	for k, p := range g.routes {
		if k.model != model {
			continue
		}
		if m, n := p.median(); n >= guardMinSamples && m > guardBound {
			off = true
		}
	}
	g.off[model] = off
}

// guarded reports whether model's predictions are off: slo decides by
// capacity.
func (b *Broker) guarded(model string) bool {
	g := &b.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.off[model]
}

// PredictionStats is how slo dispatch's recent TTFT and ITL predictions
// for one route fared.
type PredictionStats struct {
	// Samples is how many recent TTFT predictions are scored (at most the
	// guard's window); MedianError the median of |actual - predicted| /
	// actual over them.
	Samples     int     `json:"samples"`
	MedianError float64 `json:"median_relative_error"`
	// ITLSamples and ITLMedianError are the same of the predicted ITLs
	// (mean time per output token after the first), scored as requests end.
	ITLSamples     int     `json:"itl_samples"`
	ITLMedianError float64 `json:"itl_median_relative_error"`
	// Off: either median is past the guard's bound, so the model's
	// requests are decided by capacity.
	Off bool `json:"off"`
	// Probes is how many requests slo sent to the route as probes: the
	// predictions avoided it and its figures were stale.
	Probes uint64 `json:"probes"`
}

// SLOPredictions returns how model's predictions on route fared (and
// the probes sent there), and whether the guard holds for the model.
func (b *Broker) SLOPredictions(model string, route dispatch.Route) (PredictionStats, bool) {
	g := &b.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	ps := PredictionStats{Probes: b.SLOProbes(model, route)}
	if p := g.routes[guardKey{obsKey{model, route}, false}]; p != nil {
		ps.MedianError, ps.Samples = p.median()
		ps.Off = ps.Samples >= guardMinSamples && ps.MedianError > guardBound
	}
	if p := g.routes[guardKey{obsKey{model, route}, true}]; p != nil {
		ps.ITLMedianError, ps.ITLSamples = p.median()
		ps.Off = ps.Off || (ps.ITLSamples >= guardMinSamples && ps.ITLMedianError > guardBound)
	}
	return ps, g.off[model]
}
