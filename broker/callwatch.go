package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/subjects"
)

// The reader's checks of the current attempt, which its clock runs (see
// readerClock): the stall check, and the watch for dead agents, jobs
// nobody takes and streams a reconnect cut. Each coordinates the call's
// groups (its clock, its attempt, its tally) with the broker's view of the
// fleet, so they are the Call's.

// checkStall runs when the stall check is due: it pushes the check back
// while the agent is not silent for StallTimeout, and recovers the attempt
// when it is.
func (c *Call) checkStall(ctx context.Context) error {
	if c.waitingForDecode() {
		// Between the hand-off and the decode agent's accept no agent
		// speaks: the decode queue may be busy. The bound is how long the
		// prefill engine holds the KV.
		if left := c.handedOff.Add(c.b.cfg.KVHold).Sub(c.b.now()); left > 0 {
			c.stallIn(min(left, c.stall))
			return nil
		}
		if err := c.recover(ctx, fmt.Errorf("%w: request %s: %s", errHandoffExpired, c.ID, c.b.cfg.KVHold)); err != nil {
			return err
		}
		c.restartStall()
		return nil
	}
	// The time the broker itself stood still is not the agent's silence:
	// its chunks waited unread meanwhile.
	paused, now := c.b.pauses.since(c.asked)
	if idle := now.Sub(c.asked) - paused; idle < c.b.cfg.StallTimeout {
		c.stallIn(c.stall - idle)
		return nil
	}
	if err := c.recover(ctx, fmt.Errorf("%w: request %s: nothing for %s", ErrStalled, c.ID, c.b.cfg.StallTimeout)); err != nil {
		return err
	}
	c.restartStall()
	return nil
}

// checkWatch runs every WatchInterval: before the first token it ends a
// request nobody took in time, and at any time it recovers an attempt
// that is stuck or whose stream went silent when the broker reconnected.
func (c *Call) checkWatch(ctx context.Context) error {
	if c.agent == "" && c.prefillAgent == "" && c.firstToken.IsZero() && !c.waitsInQueue() && c.b.now().Sub(c.Started) > c.b.cfg.QueueTimeout {
		// Nobody took the job in time: give up cleanly; the cancel at
		// Close keeps the queued job from starting.
		return fmt.Errorf("%w: request %s waited %s", ErrQueueTimeout, c.ID, c.b.cfg.QueueTimeout)
	}
	why := c.stuck()
	if why == nil {
		why = c.silentSinceReconnect()
	}
	if why == nil {
		return nil
	}
	if err := c.recover(ctx, why); err != nil {
		return err
	}
	c.restartStall()
	return nil
}

// stuck reports why the current attempt should be abandoned: before its
// first token, nobody can take its job; at any time, the agent that took it
// is gone.
func (c *Call) stuck() error {
	if c.b.now().Sub(c.attemptStart) < c.b.cfg.AcceptTimeout && c.agent == "" {
		return nil
	}
	m, ok := c.b.table.Load().Model(c.Model)
	if !ok {
		return nil
	}
	if c.agent == "" && c.prefillAgent != "" && c.handedOff.IsZero() {
		// A prefill agent runs the leg: it is alive as long as it
		// heartbeats, however long the prompt, whatever the pool's state.
		return c.agentGone(m, c.prefillAgent)
	}
	if c.agent == "" {
		// With its route out of service the job would wait for nobody,
		// unless an agent took it a moment ago and its accepted chunk is
		// on the way: running it elsewhere then would run it twice.
		if !routeEligible(m, c.Route, c.pair) && (!c.handedOff.IsZero() || !c.jobTaken()) {
			return fmt.Errorf("%w: route %s of %q has no eligible agent", errNotTaken, routeName(c.Route, c.pair), c.Model)
		}
		// Neither accepted nor waiting: an agent took the job and died
		// before it could say so. Allow for heartbeats and the queue depth
		// poll to catch up before calling the job lost.
		if !c.handedOff.IsZero() {
			return nil // the decode queue holds it; bounded by KVHold
		}
		if c.prefillAgent != "" {
			return c.agentGone(m, c.prefillAgent) // the prefill leg runs
		}
		grace := c.b.cfg.AcceptTimeout + 3*c.b.cfg.HeartbeatInterval
		if c.b.now().Sub(c.attemptStart) > grace {
			if n, ok := c.queued(c.attemptStart.Add(grace)); ok && n == 0 {
				return fmt.Errorf("%w: taken from the %s queue but never accepted", errAgentLost, c.Route)
			}
			if c.deliveredUnaccepted() {
				// The job is still in the stream, but its consumer
				// delivered it: to a pull whose agent never got it (it
				// went through a NATS node that died) or never said so.
				// JetStream would offer it again only after its AckWait.
				return fmt.Errorf("%w: delivered from the %s queue but never accepted", errAgentLost, c.Route)
			}
		}
		return nil
	}
	return c.agentGone(m, c.agent)
}

// deliveryCheckEvery bounds how often a waiting attempt asks its queue's
// consumer whether its job was delivered.
const deliveryCheckEvery = time.Second

// deliveredUnaccepted reports whether the current attempt's job was
// delivered by its queue's consumer although no agent accepted it; an
// agent accepts within milliseconds of a delivery. Asked at most every
// deliveryCheckEvery, bounded by half a second: no answer is no.
func (c *Call) deliveredUnaccepted() bool {
	// An offer in the directed stream is not asked about: its wait ends
	// before, and moves it to the shared queue if it is still there.
	if c.jobSeq == 0 || c.aff.directed || c.b.now().Sub(c.deliveryChecked) < deliveryCheckEvery {
		return false
	}
	c.deliveryChecked = c.b.now()
	var name string
	var err error
	switch {
	case c.req.Class == ClassBatch:
		pool := subjects.PoolRegular
		if c.Route == dispatch.RoutePD {
			pool = subjects.PoolPrefill
		}
		name, err = subjects.BatchConsumerName(c.Model, pool, c.pair)
	case c.Route == dispatch.RoutePD && c.pair != "":
		name, err = subjects.PDConsumerName(c.Model, subjects.PoolPrefill, c.pair)
	case c.Route == dispatch.RoutePD:
		name, err = subjects.ConsumerName(c.Model, subjects.PoolPrefill)
	default:
		name, err = subjects.ConsumerName(c.Model, subjects.PoolRegular)
	}
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	cons, err := c.b.js.Consumer(ctx, c.b.cfg.Stream, name)
	if err != nil {
		return false
	}
	return cons.CachedInfo().Delivered.Stream >= c.jobSeq
}

// reconnectSilence is how long an attempt that was speaking may stay
// silent after the broker's connection came back before its stream is
// taken as broken: the chunks sent to the lost node, the last ones (a
// final) included, are gone, and nothing else would show it before the
// stall timeout. Agents speak every keep-alive interval (1 s) before the
// first token and every token after it.
const reconnectSilence = 3 * time.Second

// silentSinceReconnect reports an attempt that an agent runs, that spoke
// before the broker's connection was lost and has said nothing since it
// came back reconnectSilence ago.
func (c *Call) silentSinceReconnect() error {
	// When chunks arrived, not when the reader took them: chunks that
	// came before the connection was lost may be read after it is back.
	rc, last := c.b.reconnected.Load(), c.arrived.Load()
	if rc == 0 || last == 0 || last >= rc {
		return nil
	}
	at := time.Unix(0, rc)
	if c.attemptStart.After(at) || c.b.now().Sub(at) < reconnectSilence {
		return nil
	}
	if c.agent == "" && (c.prefillAgent == "" || !c.handedOff.IsZero()) {
		return nil // in a queue: nobody speaks for it
	}
	return fmt.Errorf("%w: request %s: nothing since the broker reconnected %s ago", ErrStreamBroken, c.ID, c.b.now().Sub(at).Round(time.Millisecond))
}

// routeEligible reports whether the queue an attempt went to still has
// agents that pull it: for PD, its own pairing.
func routeEligible(m *dispatch.Model, route dispatch.Route, pair string) bool {
	if route != dispatch.RoutePD || pair == "" {
		return m.Eligible(route)
	}
	for _, p := range m.Pairs() {
		if p.Key == pair {
			return p.Eligible
		}
	}
	return false
}

func routeName(route dispatch.Route, pair string) string {
	if pair == "" {
		return route.String()
	}
	return route.String() + " (" + pair + ")"
}

// agentGone reports an agent that stopped heartbeating or left the table.
// An agent whose attempt spoke within the heartbeat staleness bound is
// alive whatever its heartbeats say: they may be what a NATS failover lost
// (the agent reconnecting, the broker's subscription being renewed on
// another node), and abandoning a stream that flows would only spend a
// migration.
func (c *Call) agentGone(m *dispatch.Model, id string) error {
	missed := c.b.cfg.Dispatch.MissedHeartbeats
	if missed <= 0 {
		missed = dispatch.DefaultMissedHeartbeats
	}
	for _, a := range m.Agents() {
		if a.ID == id {
			// Chunks are a sign of life as good as heartbeats, judged on
			// the same window: the agent's own interval when it is longer
			// than the broker's.
			window := time.Duration(missed) * max(c.b.cfg.HeartbeatInterval, a.Interval)
			if !c.heard.IsZero() && c.b.now().Sub(c.heard) < window {
				return nil
			}
			if a.Reason == dispatch.ReasonStale {
				return fmt.Errorf("%w: %s stopped heartbeating", errAgentLost, id)
			}
			return nil
		}
	}
	if !c.heard.IsZero() && c.b.now().Sub(c.heard) < time.Duration(missed)*c.b.cfg.HeartbeatInterval {
		return nil
	}
	return fmt.Errorf("%w: %s left the table", errAgentLost, id)
}

// queued returns the jobs waiting in the current route's first queue, if
// the depth was read after since.
func (c *Call) queued(since time.Time) (int, bool) {
	pool := subjects.PoolRegular
	if c.Route == dispatch.RoutePD {
		pool = subjects.PoolPrefill
	}
	r := c.b.depth.Load()
	if r == nil || r.at.Before(since) {
		return 0, false
	}
	if c.req.Class == ClassBatch {
		return r.batch[c.Model][pool], true
	}
	return r.pools[c.Model][pool], true
}
