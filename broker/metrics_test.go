package broker

import (
	"flag"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/goldentest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/wire"
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
	b.depth.Store(&depthReading{pools: depth, at: now})
	m.requests.WithLabelValues("m", "regular", OutcomeOK).Inc()
	m.inflight.Set(2)
	m.ttft.WithLabelValues("m", "pd").Observe(0.03)
	m.itl.WithLabelValues("m", "pd").Observe(0.004)
	m.e2e.WithLabelValues("m", "pd").Observe(1.5)
	m.outputTokens.WithLabelValues("m", "pd").Add(42)
	m.Reject("queue_full")
	m.retries.WithLabelValues("agent_lost").Inc()
	m.affinity.WithLabelValues("m", "regular", AffinityHit).Inc()
	m.secondRuns.WithLabelValues("prefill").Inc()
	b.affPool("m", "regular").tree.Insert("r1", []uint64{1, 2})
	b.agents[agentKey{"m", "r1"}] = &agentEntry{hb: &wire.Heartbeat{AgentId: "r1", Model: "m", Pool: "regular",
		PrefixCacheQueries: proto.Float64(400), PrefixCacheHits: proto.Float64(300)}}

	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(b.Collector())
	goldentest.Exposition(t, reg, "metrics.golden", *update)
}

// TestRouteObs: a model and route's metric children are looked up once and
// count into the same series as the vectors' own lookups.
func TestRouteObs(t *testing.T) {
	m := NewMetrics()
	b := &Broker{metrics: m}
	o := b.obs("m", dispatch.RouteRegular)
	if b.obs("m", dispatch.RouteRegular) != o || b.obs("m", dispatch.RoutePD) == o || b.obs("n", dispatch.RouteRegular) == o {
		t.Fatal("obs does not map (model, route) to one entry each")
	}
	o.request(m, OutcomeOK)
	o.request(m, OutcomeOK)
	o.request(m, "shed") // an outcome the cache does not hold
	o.tokens.Add(5)
	for _, tc := range []struct {
		c    prometheus.Counter
		want float64
	}{
		{m.requests.WithLabelValues("m", "regular", OutcomeOK), 2},
		{m.requests.WithLabelValues("m", "regular", "shed"), 1},
		{m.requests.WithLabelValues("m", "pd", OutcomeOK), 0},
		{m.outputTokens.WithLabelValues("m", "regular"), 5},
	} {
		var got dto.Metric
		if err := tc.c.Write(&got); err != nil {
			t.Fatal(err)
		}
		if v := got.GetCounter().GetValue(); v != tc.want {
			t.Fatalf("%v = %v, want %v", got.GetLabel(), v, tc.want)
		}
	}
}
