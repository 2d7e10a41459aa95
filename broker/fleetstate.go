package broker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// The capacity table's cost must not grow with the fleet at rest: every
// broker hears every heartbeat. A heartbeat is folded into its agent's
// entry (onHeartbeat); a model's snapshot is rebuilt only when one of its
// agents changed in a way the snapshot shows (agentChanged), when an
// agent's view changes with time alone (it went stale, it ramps up, its
// learned timing expired or was updated), and at least every refreshEvery
// so that the snapshot's last-heartbeat times shown in the fleet view stay
// recent. Every other model keeps its snapshot.

// refreshEvery is how old a model's snapshot may get while nothing in it
// changes.
const refreshEvery = 2 * time.Second

// fleetState is what rebuild keeps between snapshots; guarded by
// Broker.mu, apart from building.
type fleetState struct {
	// building serialises rebuilds: each starts from the snapshot the
	// last one stored, so two at once would lose one's models. Taken
	// before Broker.mu.
	building sync.Mutex
	// dirty holds the models to rebuild at the next rebuild; all, every
	// model (the broker was deaf, and every agent's last-heard time
	// moved).
	dirty map[string]struct{}
	all   bool
	// built is when each model's snapshot was last built.
	built map[string]time.Time
}

// counted is what a model's snapshot took from an agent's entry at its
// build that may change with time alone.
type counted struct {
	fresh   bool
	ramping bool      // its effective slots grow with time
	expires time.Time // when its learned timing gets too old; zero: never
}

// markDirty asks for model's snapshot to be rebuilt. b.mu must be held.
func (b *Broker) markDirty(model string) {
	if b.fleet.dirty == nil {
		b.fleet.dirty = make(map[string]struct{})
	}
	b.fleet.dirty[model] = struct{}{}
}

// agentChanged reports whether an agent's new heartbeat changes what a
// snapshot shows of it, beyond its last-heard time.
func agentChanged(prev, a *dispatch.Agent) bool {
	return prev.State != a.State || prev.Pool != a.Pool || prev.Slots != a.Slots || prev.Active != a.Active || prev.Batch != a.Batch ||
		prev.PullLimit != a.PullLimit || prev.EngineWaiting != a.EngineWaiting || prev.StateReason != a.StateReason || prev.PDProtocol != a.PDProtocol ||
		prev.PDLabels != a.PDLabels || prev.Interval != a.Interval || !prev.ReadySince.Equal(a.ReadySince)
}

// dueModels returns the models whose snapshot must be rebuilt at now and
// forgets the agents silent for longer than forgetAfter. b.mu must be
// held.
func (b *Broker) dueModels(now time.Time) map[string]struct{} {
	due := b.fleet.dirty
	b.fleet.dirty = nil
	if due == nil {
		due = make(map[string]struct{})
	}
	for _, m := range b.timing.takeChanged() {
		due[m] = struct{}{}
	}
	cfg := b.cfg.Dispatch
	for k, e := range b.agents {
		if now.Sub(e.agent.LastSeen) > forgetAfter {
			delete(b.agents, k)
			b.timing.drop(k)
			due[k.model] = struct{}{}
			continue
		}
		if b.fleet.all {
			due[k.model] = struct{}{}
			continue
		}
		if _, ok := due[k.model]; ok {
			continue
		}
		c := &e.counted
		if c.ramping || dispatch.Fresh(e.agent, now, cfg) != c.fresh || (!c.expires.IsZero() && !now.Before(c.expires)) {
			due[k.model] = struct{}{}
		}
	}
	b.fleet.all = false
	for m, at := range b.fleet.built {
		if now.Sub(at) >= refreshEvery {
			due[m] = struct{}{}
		}
	}
	return due
}

// buildModels returns the agents of the models in due, with their learned
// timing, and records in each entry what the snapshot counts. b.mu must
// be held.
func (b *Broker) buildModels(due map[string]struct{}, now time.Time) map[string][]dispatch.Agent {
	cfg := b.cfg.Dispatch
	maxAge := cfg.TimingMaxAge
	if maxAge == 0 {
		maxAge = dispatch.DefaultTimingMaxAge
	}
	byModel := make(map[string][]dispatch.Agent, len(due))
	for k, e := range b.agents {
		if _, ok := due[k.model]; !ok {
			continue
		}
		a := e.agent
		a.Timing = b.timing.of(k.model, k.id)
		e.counted = counted{
			fresh:   dispatch.Fresh(a, now, cfg),
			ramping: a.State == dispatch.StateReady && dispatch.Ramp(a.Slots, a.ReadySince, now, cfg) < float64(a.Slots),
		}
		if a.Timing.Samples > 0 && maxAge > 0 && !a.Timing.Updated.IsZero() {
			e.counted.expires = a.Timing.Updated.Add(maxAge)
		}
		byModel[k.model] = append(byModel[k.model], a)
	}
	if b.fleet.built == nil {
		b.fleet.built = make(map[string]time.Time)
	}
	for m := range due {
		if _, ok := byModel[m]; ok {
			b.fleet.built[m] = now
		} else {
			delete(b.fleet.built, m)
		}
	}
	return byModel
}

// nextFleet returns old with the models in due replaced by the snapshots
// of byModel (a model in due without agents leaves the fleet).
func nextFleet(old *dispatch.Fleet, due map[string]struct{}, byModel map[string][]dispatch.Agent, now time.Time, cfg dispatch.Config) *dispatch.Fleet {
	models := make([]*dispatch.Model, 0, len(byModel)+len(old.AllModels()))
	for _, name := range old.AllModels() {
		if _, ok := due[name]; !ok {
			m, _ := old.Model(name)
			models = append(models, m)
		}
	}
	for name, as := range byModel {
		models = append(models, dispatch.NewModel(name, as, now, cfg))
	}
	return dispatch.FleetOf(models)
}

// heartbeatDrain is how often the broker reads the heartbeats that
// arrived. They wait in the subscription's channel meanwhile, so a fleet's
// heartbeats, spread over their interval, wake the broker's heartbeat
// goroutine once per drain rather than once each; a drain's delay is
// small against the missed heartbeats that make an agent stale.
const heartbeatDrain = 20 * time.Millisecond

// heartbeatQueue bounds the heartbeats waiting for a drain; beyond it
// NATS drops them (a slow consumer), as it would a subscription's.
const heartbeatQueue = 1 << 14

// subscribeHeartbeats reads every heartbeat into the capacity table until
// ctx ends or stop is called.
func (b *Broker) subscribeHeartbeats(ctx context.Context) (stop func(), err error) {
	ch := make(chan *nats.Msg, heartbeatQueue)
	sub, err := b.nc.ChanSubscribe(b.subj.HeartbeatsAll(), ch)
	if err != nil {
		return nil, fmt.Errorf("broker: subscribe heartbeats: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(heartbeatDrain)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for n := len(ch); n > 0; n-- {
				b.onHeartbeat(<-ch)
			}
		}
	}()
	return func() {
		_ = sub.Unsubscribe()
		cancel()
		<-done
	}, nil
}
