package broker

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/natstest"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestMetricsGolden pins the names, help, types, labels and buckets of the
// broker's metrics, with one deterministic observation each.
func TestMetricsGolden(t *testing.T) {
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	m := NewMetrics()
	b, err := New(nc, Config{Dispatch: dispatch.Config{Mode: dispatch.ModeCapacity}}, WithMetrics(m), WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	b.table.Store(dispatch.NewFleet(map[string][]dispatch.Agent{"m": {
		{ID: "r1", Pool: dispatch.PoolRegular, State: dispatch.StateReady, Slots: 8, Active: 2, LastSeen: now, Interval: time.Second},
		{ID: "p1", Pool: dispatch.PoolPrefill, State: dispatch.StateReady, Slots: 4, Active: 1, LastSeen: now, Interval: time.Second},
		{ID: "d1", Pool: dispatch.PoolDecode, State: dispatch.StateDraining, Slots: 4, LastSeen: now, Interval: time.Second},
		{ID: "d2", Pool: dispatch.PoolDecode, State: dispatch.StateReady, Slots: 4, LastSeen: now.Add(-time.Minute), Interval: time.Second},
	}}, now, b.cfg.Dispatch))
	depth := map[string]map[string]int{"m": {"regular": 3}}
	b.depth.Store(&depth)
	m.requests.WithLabelValues("m", "regular", OutcomeOK).Inc()
	m.inflight.Set(2)
	m.ttft.WithLabelValues("m", "pd").Observe(0.03)
	m.itl.WithLabelValues("m", "pd").Observe(0.004)
	m.e2e.WithLabelValues("m", "pd").Observe(1.5)
	m.outputTokens.WithLabelValues("m", "pd").Add(42)
	m.Reject("queue_full")
	m.retries.WithLabelValues("agent_lost").Inc()

	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(b.Collector())
	compareExposition(t, reg, "metrics.golden")
}

func compareExposition(t *testing.T, reg *prometheus.Registry, name string) {
	t.Helper()
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
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("exposition differs from %s (run with -update to accept):\n%s", path, buf.String())
	}
}
