package broker

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// routeObs holds one (model, route)'s children of the per-request
// metrics: a label lookup hashes its values and takes the vector's lock,
// four or five of them per request, so they are looked up once.
type routeObs struct {
	model, route   string
	ttft, itl, e2e prometheus.Observer
	// predicted and predErr score slo's predicted TTFT (sloguard.go),
	// predictedITL and predErrITL its predicted ITL.
	predicted, predErr       prometheus.Observer
	predictedITL, predErrITL prometheus.Observer
	tokens                   prometheus.Counter
	requests                 map[string]prometheus.Counter // by outcome, filled as they happen
}

type obsKey struct {
	model string
	route dispatch.Route
}

// routeObsCache maps (model, route) to its routeObs. Models are the
// served ones (an unknown model is refused before a call exists), so it
// stays as small as the metrics' own label sets.
type routeObsCache struct {
	mu sync.RWMutex
	m  map[obsKey]*routeObs
}

// obs returns the metric children of model and route.
func (b *Broker) obs(model string, route dispatch.Route) *routeObs {
	c := &b.routeObs
	k := obsKey{model, route}
	c.mu.RLock()
	o := c.m[k]
	c.mu.RUnlock()
	if o != nil {
		return o
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if o = c.m[k]; o != nil {
		return o
	}
	r := route.String()
	m := b.metrics
	o = &routeObs{
		model: model, route: r,
		ttft: m.ttft.WithLabelValues(model, r), itl: m.itl.WithLabelValues(model, r), e2e: m.e2e.WithLabelValues(model, r),
		predicted: m.sloPredicted.WithLabelValues(model, r), predErr: m.sloError.WithLabelValues(model, r),
		predictedITL: m.sloPredictedITL.WithLabelValues(model, r), predErrITL: m.sloErrorITL.WithLabelValues(model, r),
		tokens:   m.outputTokens.WithLabelValues(model, r),
		requests: make(map[string]prometheus.Counter, 3),
	}
	for _, outcome := range []string{OutcomeOK, OutcomeError, OutcomeCancelled} {
		o.requests[outcome] = m.requests.WithLabelValues(model, r, outcome)
	}
	if c.m == nil {
		c.m = make(map[obsKey]*routeObs)
	}
	c.m[k] = o
	return o
}

// request counts one ended request of outcome.
func (o *routeObs) request(m *Metrics, outcome string) {
	if ctr, ok := o.requests[outcome]; ok {
		ctr.Inc()
		return
	}
	m.requests.WithLabelValues(o.model, o.route, outcome).Inc() // an outcome an ingress named itself
}
