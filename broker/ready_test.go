package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/natstest"
)

// TestReady: within its first heartbeat interval a broker says it is
// listening for heartbeats only while no agent is eligible; once one is,
// requests can be dispatched and it is ready; after an interval it is
// ready whatever the fleet.
func TestReady(t *testing.T) {
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	b, err := New(nc, Config{HeartbeatInterval: time.Second}, WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ready(); err == nil {
		t.Fatal("ready before Run subscribed")
	}
	b.started.Store(now.UnixNano())
	now = now.Add(300 * time.Millisecond)
	if err := b.Ready(); err == nil || !strings.Contains(err.Error(), "listening for heartbeats") {
		t.Fatalf("Ready() = %v with nothing heard, want listening for heartbeats", err)
	}
	b.table.Store(dispatch.NewFleet(map[string][]dispatch.Agent{"m": {
		{ID: "r1", Pool: dispatch.PoolRegular, State: dispatch.StateReady, Slots: 8, LastSeen: now, Interval: time.Second},
	}}, now, b.cfg.Dispatch))
	if err := b.Ready(); err != nil {
		t.Fatalf("Ready() = %v with an eligible agent", err)
	}
	b.table.Store(dispatch.NewFleet(nil, now, b.cfg.Dispatch))
	now = now.Add(time.Second)
	if err := b.Ready(); err != nil {
		t.Fatalf("Ready() = %v after a whole interval", err)
	}
	b.StopAccepting()
	if err := b.Ready(); err == nil {
		t.Fatal("ready after StopAccepting")
	}
}
