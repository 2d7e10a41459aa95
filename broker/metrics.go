package broker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/wire"
)

// OutcomeClientError is the outcome of a request its engine refused as
// invalid (a 400): the client's mistake, counted apart from "error", the
// failures of the fleet that operators watch.
const OutcomeClientError = "client_error"

// errorOutcome is the outcome of a request that ended with e.
func errorOutcome(e *wire.Error) string {
	if e.GetCode() == wire.CodeBadRequest {
		return OutcomeClientError
	}
	return OutcomeError
}

// Metrics are the broker's Prometheus collectors. Labels are bounded: model
// ids come from heartbeats of agents, never from clients (a request for an
// unknown model is rejected before any metric sees its name).
type Metrics struct {
	requests     *prometheus.CounterVec
	inflight     prometheus.Gauge
	ttft         *prometheus.HistogramVec
	itl          *prometheus.HistogramVec
	e2e          *prometheus.HistogramVec
	outputTokens *prometheus.CounterVec
	rejections   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	migrations   prometheus.Counter
	// publishRetries counts tries of a job's publish that NATS could not
	// take now (a leader election, a reconnect) and were made again.
	publishRetries prometheus.Counter
	// droppedChunks counts reply chunks dropped before any request saw
	// them: undecodable, or without their attempt's secret (forged).
	droppedChunks *prometheus.CounterVec
	affinity      *prometheus.CounterVec
	// secondRuns counts agents told to stop because another agent's run
	// of the same attempt is the one relayed.
	secondRuns *prometheus.CounterVec
	// slo counts the requests with latency targets that ended well, by
	// whether they met them.
	slo *prometheus.CounterVec
	// sloPredicted and sloError are ModeSLO's predicted TTFT of the
	// requests it predicted for, and how far off it was; sloFallback
	// counts its decisions by capacity, by reason.
	sloPredicted, sloError *prometheus.HistogramVec
	// sloPredictedITL and sloErrorITL are the same of its predicted ITL.
	sloPredictedITL, sloErrorITL *prometheus.HistogramVec
	sloFallback                  *prometheus.CounterVec
	// sloProbes counts the requests slo sent, as probes, to a route it
	// avoids whose figures are stale.
	sloProbes *prometheus.CounterVec
	// dispatchPublish is the broker's own time per attempt: the dispatch
	// decision, the job's encoding and its publish until JetStream
	// stored it.
	dispatchPublish prometheus.Histogram
}

// Latency buckets for LLM serving, in seconds: TTFT spans milliseconds
// (a warm cache) to tens of seconds (a long prompt behind a queue).
var (
	ttftBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	itlBuckets  = []float64{.0005, .001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28}
	e2eBuckets  = []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 600}
	// dispatchBuckets resolve a sub-millisecond decision and publish, up
	// to a publish that waited out a leader election.
	dispatchBuckets = []float64{.0001, .00025, .0005, .00075, .001, .0015, .002, .003, .005, .01, .025, .05, .1, .5, 2.5, 15}
)

// NewMetrics returns unregistered collectors; Register adds them to a registry.
func NewMetrics() *Metrics {
	return &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_requests_total",
			Help: "Requests that ended, by model, route and outcome: ok, error (the broker, NATS, an agent or an engine failed), client_error (the engine refused the request as invalid), cancelled (the client went away), shutdown (the broker stopped before it ended, past its shutdown grace).",
		}, []string{"model", "route", "outcome"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_requests_in_flight", Help: "Requests submitted and not yet ended.",
		}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_time_to_first_token_seconds", Help: "Time from submission to the first token.", Buckets: ttftBuckets,
		}, []string{"model", "route"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_inter_token_latency_seconds", Help: "Time between consecutive token chunks.", Buckets: itlBuckets,
		}, []string{"model", "route"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_request_duration_seconds", Help: "Time from submission to the end of the request.", Buckets: e2eBuckets,
		}, []string{"model", "route"}),
		outputTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_output_tokens_total", Help: "Completion tokens relayed to clients.",
		}, []string{"model", "route"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_retries_total", Help: "Attempts abandoned before the first token and dispatched again, by reason.",
		}, []string{"reason"}),
		migrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_migrations_total", Help: "Streams continued on another agent after their first token.",
		}),
		publishRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_publish_retries_total", Help: "Job publishes tried again because NATS could not take them now (a leader election or a reconnect).",
		}),
		droppedChunks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_dropped_chunks_total", Help: "Reply chunks dropped: undecodable, or without their attempt's secret (bad_secret: forged or misrouted).",
		}, []string{"reason"}),
		affinity: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_affinity_dispatches_total",
			Help: "Prefix-cache affinity per pool: result affinity (offered to the agent caching the longest prefix) or the fallback to the shared queue (no_match, full, imbalanced); not_taken_in_time counts offers that moved to the shared queue, directed_unusable those sent there because the directed stream was unusable.",
		}, []string{"model", "pool", "result"}),
		secondRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_second_runs_stopped_total",
			Help: "Agents cancelled because another agent ran the same attempt and spoke first (an affinity offer moved to the shared queue as its agent took it, an ack lost in a failover), by stage (main, prefill).",
		}, []string{"stage"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_rejections_total", Help: "Requests refused before dispatch, by reason.",
		}, []string{"reason"}),
		slo: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_slo_requests_total",
			Help: "Requests with latency targets that ended well, by model, route and whether they met their targets (result met or missed): time to first token, and mean time per output token after the first.",
		}, []string{"model", "route", "result"}),
		sloPredicted: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_slo_predicted_ttft_seconds", Help: "Time to first token that slo dispatch predicted for the requests it predicted for (its attempt's publish to first token), by model and route; compare with switchyard_time_to_first_token_seconds.", Buckets: ttftBuckets,
		}, []string{"model", "route"}),
		sloError: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_slo_ttft_prediction_error_ratio", Help: "How far off slo dispatch's predicted time to first token was: |actual - predicted| / actual, by model and route.", Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10},
		}, []string{"model", "route"}),
		sloPredictedITL: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_slo_predicted_itl_seconds", Help: "Mean time per output token after the first that slo dispatch predicted for the requests it predicted for, by model and route; compare with switchyard_inter_token_latency_seconds.", Buckets: prometheus.ExponentialBuckets(.001, 2, 12),
		}, []string{"model", "route"}),
		sloErrorITL: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_slo_itl_prediction_error_ratio", Help: "How far off slo dispatch's predicted mean time per output token after the first was, for requests that ended well: |actual - predicted| / actual, by model and route.", Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10},
		}, []string{"model", "route"}),
		sloFallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_slo_fallback_total", Help: "Requests slo dispatch decided by capacity, by model and reason: no_targets, no_history, unreported (engines report no cached prompt tokens), predictions_off (the guard: recent predictions off beyond the bound).",
		}, []string{"model", "reason"}),
		sloProbes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_slo_probes_total", Help: "Requests slo dispatch sent, as probes, to a route its predictions avoid whose learned figures are stale, so that they are learned afresh; by model and route.",
		}, []string{"model", "route"}),
		dispatchPublish: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchyard_dispatch_publish_seconds", Help: "Time per dispatched attempt from the start of its dispatch decision until JetStream stored its job: the decision, the job's encoding and the publish (its retries included).", Buckets: dispatchBuckets,
		}),
	}
}

// Register adds every collector to r.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.requests, m.inflight, m.ttft, m.itl, m.e2e, m.outputTokens, m.rejections, m.retries, m.migrations, m.publishRetries, m.droppedChunks, m.affinity, m.secondRuns, m.slo, m.sloPredicted, m.sloError, m.sloPredictedITL, m.sloErrorITL, m.sloFallback, m.sloProbes, m.dispatchPublish} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Reject counts a request refused before dispatch.
func (m *Metrics) Reject(reason string) { m.rejections.WithLabelValues(reason).Inc() }

// WithMetrics makes the broker record into m.
func WithMetrics(m *Metrics) Option { return func(b *Broker) { b.metrics = m } }

// Metrics returns the broker's collectors.
func (b *Broker) Metrics() *Metrics { return b.metrics }
