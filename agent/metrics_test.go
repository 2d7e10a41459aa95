package agent

import (
	"flag"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/internal/goldentest"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestMetricsGolden pins the agent's metric names, types, labels and buckets.
func TestMetricsGolden(t *testing.T) {
	a := &Agent{}
	m := newMetrics(a)
	m.jobs.WithLabelValues(JobOK).Add(3)
	m.jobs.WithLabelValues(JobCancelled).Inc()
	m.ttft.Observe(0.02)
	m.duration.Observe(1.2)
	m.hbErrors.Inc()
	m.kvBlocks.WithLabelValues(KVBlockTranslated).Add(5)
	m.kvBlocks.WithLabelValues(KVBlockUnknownParent).Inc()
	m.kvTokenize.WithLabelValues(KVTokenizeOK).Inc()
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	goldentest.Exposition(t, reg, "metrics.golden", *update)
}
