package broker

import (
	"sync"
	"sync/atomic"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// inFlight counts, per queue (model, pool, PD pairing), the jobs of this
// broker that no agent has taken yet (pending) and the jobs agents took and
// still hold (active). Heartbeats report active jobs up to an interval late
// and never report queued ones; these counts let the dispatch rule see a
// job the moment it is sent, so weights react between heartbeats and a
// ramping agent is not sent a backlog its effective slots cannot hold.
type inFlight struct {
	models sync.Map // model -> *modelFlight
}

// modelFlight is one model's counters. It implements dispatch.InFlight.
type modelFlight struct {
	regular flightCount
	mu      sync.Mutex                                // serialises adding a PD queue's counters
	pd      atomic.Pointer[map[pairPool]*flightCount] // copied on add, so Decide reads without a lock
}

type pairPool struct {
	pool dispatch.Pool
	pair string
}

// flightCount is one queue's counters.
type flightCount struct {
	pending, active atomic.Int64
}

func (f *inFlight) model(name string) *modelFlight {
	if v, ok := f.models.Load(name); ok {
		return v.(*modelFlight)
	}
	v, _ := f.models.LoadOrStore(name, new(modelFlight))
	return v.(*modelFlight)
}

// count returns the counters of (pool, pair), creating them.
func (m *modelFlight) count(pool dispatch.Pool, pair string) *flightCount {
	if pool == dispatch.PoolRegular {
		return &m.regular
	}
	k := pairPool{pool, pair}
	if c := m.pdCount(k); c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.pdCount(k); c != nil {
		return c
	}
	next := make(map[pairPool]*flightCount)
	if old := m.pd.Load(); old != nil {
		for kk, v := range *old {
			next[kk] = v
		}
	}
	c := new(flightCount)
	next[k] = c
	m.pd.Store(&next)
	return c
}

// pdCount returns the counters of a PD queue, nil if none were made yet.
func (m *modelFlight) pdCount(k pairPool) *flightCount {
	if p := m.pd.Load(); p != nil {
		return (*p)[k]
	}
	return nil
}

// Outstanding implements dispatch.InFlight.
func (m *modelFlight) Outstanding(pool dispatch.Pool, pair string) (pending, active int) {
	var c *flightCount
	if pool == dispatch.PoolRegular {
		c = &m.regular
	} else {
		if c = m.pdCount(pairPool{pool, pair}); c == nil {
			return 0, 0
		}
	}
	return int(max(c.pending.Load(), 0)), int(max(c.active.Load(), 0))
}

// Stages of an attempt's load, in order.
const (
	loadNone    = iota // nothing counted
	loadPending        // dispatched, no agent took it
	loadPrefill        // PD: the prefill agent took it, the decode leg did not yet
	loadTaken          // the (regular or decode) agent took it
)

// attemptLoad is what one attempt counts in inFlight: for a regular job one
// regular slot; for a PD job a prefill slot until its decode leg is taken,
// and a decode slot for its whole life (the decode agent holds it from
// the hand-off to the last token). Only the call's reader changes it.
type attemptLoad struct {
	pre, main *flightCount
	stage     int
	// offered is the agent a directed job waits for (prefix-cache
	// affinity) until it is taken or moves; agent the agent of the
	// attempt's affinity pool that holds it (see affinity.go).
	offered, agent *agentLoad
}

// offer counts the attempt's job as offered to l.
func (l *attemptLoad) offer(a *agentLoad) {
	l.settleOffer()
	a.offered.Add(1)
	l.offered = a
}

// settleOffer ends the offer: taken, moved or abandoned.
func (l *attemptLoad) settleOffer() {
	if l.offered != nil {
		l.offered.offered.Add(-1)
		l.offered = nil
	}
}

// holdAgent counts the attempt as held by a.
func (l *attemptLoad) holdAgent(a *agentLoad) {
	l.releaseAgent()
	a.held.Add(1)
	l.agent = a
}

// releaseAgent ends holdAgent.
func (l *attemptLoad) releaseAgent() {
	if l.agent != nil {
		l.agent.held.Add(-1)
		l.agent = nil
	}
}

// dispatched counts a job just published on a queue.
func (l *attemptLoad) dispatched(m *modelFlight, route dispatch.Route, pair string) {
	if route == dispatch.RoutePD {
		l.pre, l.main = m.count(dispatch.PoolPrefill, pair), m.count(dispatch.PoolDecode, pair)
		l.pre.pending.Add(1)
	} else {
		l.pre, l.main = nil, m.count(dispatch.PoolRegular, "")
	}
	l.main.pending.Add(1)
	l.stage = loadPending
}

// prefillTaken moves a PD job from the prefill queue to the prefill agent.
func (l *attemptLoad) prefillTaken() {
	if l.stage != loadPending || l.pre == nil {
		return
	}
	l.pre.pending.Add(-1)
	l.pre.active.Add(1)
	l.stage = loadPrefill
}

// taken moves the job to the agent that streams it.
func (l *attemptLoad) taken() {
	switch l.stage {
	case loadPending:
		if l.pre != nil {
			l.pre.pending.Add(-1)
		}
	case loadPrefill:
		l.pre.active.Add(-1)
	default:
		return
	}
	l.main.pending.Add(-1)
	l.main.active.Add(1)
	l.stage = loadTaken
}

// release uncounts the attempt; it is idempotent.
func (l *attemptLoad) release() {
	l.settleOffer()
	l.releaseAgent()
	switch l.stage {
	case loadPending:
		if l.pre != nil {
			l.pre.pending.Add(-1)
		}
		l.main.pending.Add(-1)
	case loadPrefill:
		l.pre.active.Add(-1)
		l.main.pending.Add(-1)
	case loadTaken:
		l.main.active.Add(-1)
	}
	l.stage = loadNone
}
