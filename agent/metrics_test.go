package agent

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
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
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join("testdata", "metrics.golden")
	if *update {
		_ = os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("exposition differs from %s (run with -update):\n%s", path, buf.String())
	}
}
