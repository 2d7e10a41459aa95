package batch

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the batch driver's metrics. Labels are bounded: a model
// (only served models pass validation) and an outcome, never a batch id;
// the batches in flight, each with its counts, are in /v1/fleet.
type Metrics struct {
	lines   *prometheus.CounterVec
	running *prometheus.GaugeVec
	retries *prometheus.CounterVec
	driven  prometheus.Gauge
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		lines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_batch_lines_total",
			Help: "Batch lines this broker ran to a recorded answer, by model and outcome (completed: a 2xx answer; failed: any other).",
		}, []string{"model", "outcome"}),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_batch_lines_running",
			Help: "Batch lines this broker has in flight, by model.",
		}, []string{"model"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_batch_line_retries_total",
			Help: "Batch lines tried again because the fleet had no room (429 or 503), by model.",
		}, []string{"model"}),
		driven: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_batches_driven",
			Help: "Batches this broker holds the lease of and drives.",
		}),
	}
}

// Register registers the metrics with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.lines, m.running, m.retries, m.driven} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
