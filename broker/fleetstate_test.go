package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/dispatch"
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
