package promtext_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-ai/switchyard/internal/promtext"
)

// TestFetch reads what client_golang serves: counters by label, an
// unlabelled gauge, a histogram's count, names with colons as vLLM's.
func TestFetch(t *testing.T) {
	reg := prometheus.NewRegistry()
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_retries_total", Help: "h"}, []string{"reason", "model"})
	running := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_running", Help: "h"}, []string{"model_name"})
	up := prometheus.NewGauge(prometheus.GaugeOpts{Name: "up_now", Help: "h"})
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "latency_seconds", Help: "h"})
	reg.MustRegister(retries, running, up, hist)
	retries.WithLabelValues("agent_lost", "m").Add(2)
	retries.WithLabelValues("stalled", "m").Add(3)
	retries.WithLabelValues("stalled", "n").Add(0)
	running.WithLabelValues("a").Set(4)
	running.WithLabelValues("b").Set(1)
	up.Set(1)
	hist.Observe(0.1)
	hist.Observe(0.2)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	m, err := promtext.Fetch(t.Context(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"counter over its series", "switchyard_retries_total", nil, 5},
		{"counter by one label", "switchyard_retries_total", []string{"reason", "stalled"}, 3},
		{"counter by two labels", "switchyard_retries_total", []string{"reason", "stalled", "model", "m"}, 3},
		{"no such label value", "switchyard_retries_total", []string{"reason", "gone"}, 0},
		{"gauge with a colon", "vllm:num_requests_running", nil, 5},
		{"unlabelled gauge", "up_now", nil, 1},
		{"histogram count", "latency_seconds", nil, 2},
		{"absent", "nothing_here", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := m.Sum(tc.metric, tc.labels...); got != tc.want {
				t.Fatalf("Sum(%s, %v) = %v, want %v", tc.metric, tc.labels, got, tc.want)
			}
		})
	}
	got := m.Samples("switchyard_retries_total", "model", "m")
	if len(got) != 2 || got[0] != (promtext.Sample{Labels: `model="m",reason="agent_lost"`, Value: 2}) {
		t.Fatalf("samples %+v", got)
	}
}

func TestErrors(t *testing.T) {
	if _, err := promtext.ParseString("metric{ 1\n"); err == nil {
		t.Fatal("a broken exposition parsed")
	}
	srv := httptest.NewServer(nil) // 404 for every path
	defer srv.Close()
	if _, err := promtext.Fetch(t.Context(), nil, srv.URL+"/metrics"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a 404 answered %v", err)
	}
}
