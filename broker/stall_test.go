package broker

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// TestRebuildForgivesOwnStall: the capacity table judges an agent's
// silence on the broker's clock. When the broker itself did not run (its
// rebuild came late), the delay is not the agent's silence; when it runs
// on time, or is late at every rebuild, a silent agent still goes stale.
func TestRebuildForgivesOwnStall(t *testing.T) {
	const iv = time.Second // stale after 3 intervals, as by default
	every := func(gap time.Duration, n int) []time.Duration { return slices.Repeat([]time.Duration{gap}, n) }
	tests := []struct {
		name string
		// gaps between the rebuilds after the agent's one heartbeat
		gaps      []time.Duration
		wantStale bool
	}{
		{"on time, silent for less than the window", every(rebuildEvery, 11), false},
		{"on time, silent for the window", every(rebuildEvery, 12), true},
		{"one stall of 10s", []time.Duration{10 * time.Second}, false},
		{"a stall after 2s of silence", append(every(rebuildEvery, 8), 10*time.Second), false},
		{"a stall after 2s of silence, then silent on time", append(every(rebuildEvery, 8), 10*time.Second, rebuildEvery, rebuildEvery, rebuildEvery), true},
		{"late at every rebuild", every(time.Second, 12), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunJetStream(t)
			nc, err := nats.Connect(s.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			b, err := New(nc, Config{HeartbeatInterval: iv}, WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			clock := time.Unix(1_000_000, 0)
			b.now = func() time.Time { return clock }

			subj, err := subjects.Must(subjects.DefaultPrefix).Heartbeat(testModel, subjects.PoolRegular, "a")
			if err != nil {
				t.Fatal(err)
			}
			data, err := wire.MarshalHeartbeat(&wire.Heartbeat{AgentId: "a", Model: testModel, Pool: subjects.PoolRegular,
				State: wire.StateReady, Slots: 1, Interval: durationpb.New(iv)})
			if err != nil {
				t.Fatal(err)
			}
			b.onHeartbeat(&nats.Msg{Subject: subj, Data: data})
			b.rebuild()
			for _, gap := range tc.gaps {
				clock = clock.Add(gap)
				b.rebuild()
			}
			m, ok := b.Fleet().Model(testModel)
			if !ok {
				t.Fatal("model not in the table")
			}
			a := m.Agents()[0]
			if stale := a.Reason == dispatch.ReasonStale; stale != tc.wantStale {
				t.Errorf("agent %+v: stale %v, want %v", a, stale, tc.wantStale)
			}
		})
	}
}
