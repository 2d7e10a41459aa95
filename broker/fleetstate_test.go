package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// fleetSim publishes the heartbeats of n ready agents of testModel every
// interval, over the rig's connection, until the test ends; agent i is
// "fleet-<i>". silence stops one agent's heartbeats.
type fleetSim struct {
	silent atomic.Int64 // index+1 of the agent that sends nothing; 0: none
}

func startFleetSim(t *testing.T, r *rig, n int, iv time.Duration) *fleetSim {
	t.Helper()
	sb := subjects.Must(subjects.DefaultPrefix)
	subj := make([]string, n)
	data := make([][]byte, n)
	for i := range n {
		id := fmt.Sprintf("fleet-%d", i)
		var err error
		if subj[i], err = sb.Heartbeat(testModel, subjects.PoolRegular, id); err != nil {
			t.Fatal(err)
		}
		data[i], err = wire.MarshalHeartbeat(&wire.Heartbeat{AgentId: id, Model: testModel, Pool: subjects.PoolRegular,
			State: wire.StateReady, Slots: 4, PullLimit: 4, Interval: durationpb.New(iv),
			ReadySince: timestamppb.New(time.Now().Add(-time.Hour))})
		if err != nil {
			t.Fatal(err)
		}
	}
	s := &fleetSim{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(iv)
		defer tick.Stop()
		for {
			for i := range n {
				if s.silent.Load() != int64(i+1) {
					_ = r.nc.Publish(subj[i], data[i])
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return s
}

// An agent that goes silent stops counting within the missed heartbeats
// and one rebuild period, however large the fleet: the model's snapshot is
// rebuilt when the agent goes stale, not only when a heartbeat changes
// something. Measured on the broker's clock, in heartbeat intervals
// (the time the broker itself did not run is forgiven, see rebuild), so a
// loaded machine does not decide the outcome.
func TestSilentAgentStopsCountingAtScale(t *testing.T) {
	const n = 2000
	iv := 500 * time.Millisecond
	r := newRig(t, Config{HeartbeatInterval: iv})
	sim := startFleetSim(t, r, n, iv)
	testwait.For(t, 60*time.Second, 20*time.Millisecond, func() error {
		m, ok := r.b.Fleet().Model(testModel)
		if !ok {
			return errors.New("model not in the table")
		}
		if got := m.Pools()[dispatch.PoolRegular].Eligible; got < n {
			return fmt.Errorf("%d of %d agents eligible", got, n)
		}
		return nil
	})
	sim.silent.Store(1) // fleet-0
	var dropped dispatch.AgentView
	var at time.Time
	testwait.For(t, 60*time.Second, 5*time.Millisecond, func() error {
		m, _ := r.b.Fleet().Model(testModel)
		for _, v := range m.Agents() {
			if v.ID != "fleet-0" {
				continue
			}
			if v.Eligible {
				return errors.New("fleet-0 still counted")
			}
			dropped, at = v, m.At()
			return nil
		}
		return errors.New("fleet-0 not in the table")
	})
	if dropped.Reason != dispatch.ReasonStale {
		t.Fatalf("fleet-0 not counted for %q, want %q", dropped.Reason, dispatch.ReasonStale)
	}
	const missed = 3
	bound := float64(missed) + float64(2*rebuildEvery)/float64(iv) // a tick's lateness allowed on top
	silent := float64(at.Sub(dropped.LastSeen)) / float64(iv)
	t.Logf("fleet-0 counted for %.2f intervals after its last heartbeat", silent)
	if silent > bound {
		t.Fatalf("fleet-0 counted for %.2f intervals after its last heartbeat, want at most %.2f", silent, bound)
	}
}

// At rest a model's snapshot is kept: heartbeats that change nothing it
// shows rebuild nothing, and a change in one model rebuilds that model
// alone. The broker's clock stands still, so no agent goes stale and no
// refresh is due; only heartbeats can move the table.
func TestSnapshotKeptAtRest(t *testing.T) {
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	at := time.Unix(2_000_000_000, 0)
	b, err := New(nc, Config{}, WithLogger(slog.New(slog.DiscardHandler)),
		WithClock(func() time.Time { return at }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	sb := subjects.Must(subjects.DefaultPrefix)
	var activeB atomic.Uint32
	send := func() {
		for _, a := range []struct{ model, id string }{{"A", "a1"}, {"A", "a2"}, {"B", "b1"}} {
			hb := &wire.Heartbeat{AgentId: a.id, Model: a.model, Pool: subjects.PoolRegular, State: wire.StateReady,
				Slots: 4, Interval: durationpb.New(time.Second)}
			if a.model == "B" {
				hb.Active = activeB.Load()
			}
			subj, err := sb.Heartbeat(a.model, subjects.PoolRegular, a.id)
			if err != nil {
				t.Error(err)
				return
			}
			data, err := wire.MarshalHeartbeat(hb)
			if err != nil {
				t.Error(err)
				return
			}
			_ = nc.Publish(subj, data)
		}
	}
	eligible := func(model string, n int) func() error {
		return func() error {
			send()
			m, ok := b.Fleet().Model(model)
			if !ok || m.Pools()[dispatch.PoolRegular].Eligible != n {
				return fmt.Errorf("model %s: not %d eligible agents yet", model, n)
			}
			return nil
		}
	}
	testwait.For(t, 10*time.Second, 20*time.Millisecond, eligible("A", 2))
	testwait.For(t, 10*time.Second, 20*time.Millisecond, eligible("B", 1))
	mA, _ := b.Fleet().Model("A")
	mB, _ := b.Fleet().Model("B")
	for range 10 { // the same heartbeats again, over several ticks
		send()
		time.Sleep(rebuildEvery / 2)
	}
	if m, _ := b.Fleet().Model("A"); m != mA {
		t.Fatal("model A rebuilt by heartbeats that changed nothing")
	}
	if m, _ := b.Fleet().Model("B"); m != mB {
		t.Fatal("model B rebuilt by heartbeats that changed nothing")
	}
	activeB.Store(1)
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		send()
		m, _ := b.Fleet().Model("B")
		if m.Pools()[dispatch.PoolRegular].Active != 1 {
			return errors.New("model B does not show b1's job yet")
		}
		return nil
	})
	if m, _ := b.Fleet().Model("A"); m != mA {
		t.Fatal("model A rebuilt for a change in model B")
	}
}

// The engine's waiting requests, as its agent's heartbeat reports them,
// reach the dispatch snapshot, and a change of them alone rebuilds it.
func TestHeartbeatEngineWaiting(t *testing.T) {
	r := newRig(t, Config{})
	hbSubj, _ := subjects.Must(subjects.DefaultPrefix).Heartbeat(testModel, subjects.PoolRegular, "w1")
	waiting := func() int {
		m, ok := r.b.Fleet().Model(testModel)
		if !ok {
			return -1
		}
		for _, a := range m.Agents() {
			if a.ID == "w1" {
				return a.EngineWaiting
			}
		}
		return -1
	}
	for _, want := range []uint32{0, 5, 2} {
		testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
			data, _ := wire.MarshalHeartbeat(&wire.Heartbeat{AgentId: "w1", Model: testModel, Pool: subjects.PoolRegular, State: wire.StateReady,
				Slots: 4, EngineWaiting: proto.Uint32(want), Interval: durationpb.New(50 * time.Millisecond)})
			if err := r.nc.Publish(hbSubj, data); err != nil {
				return err
			}
			if got := waiting(); got != int(want) {
				return fmt.Errorf("snapshot's engine waiting %d, want %d", got, want)
			}
			return nil
		})
	}
}
