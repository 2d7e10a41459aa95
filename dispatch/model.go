package dispatch

import (
	"math"
	"strconv"
	"time"
)

// Agent is what the broker knows about one agent from its last heartbeat.
type Agent struct {
	ID         string
	Pool       Pool
	State      State
	Slots      int           // max concurrent requests
	Active     int           // requests in flight, as of its last heartbeat
	ReadySince time.Time     // when it became ready; zero if never (or not reported)
	LastSeen   time.Time     // when its last heartbeat arrived (broker clock)
	Interval   time.Duration // its heartbeat interval; 0 means 1s
}

// AgentView is an agent as a snapshot counts it, for the fleet view.
type AgentView struct {
	Agent
	Eligible       bool
	EffectiveSlots float64 // slots after slow start; 0 when not eligible
	Free           float64 // max(0, EffectiveSlots - Active)
	Reason         string  // why it is not eligible; "" when it is
}

// Reasons an agent is not eligible, as in AgentView.Reason.
const (
	ReasonUnknownPool  = "unknown pool"
	ReasonUnknownState = "unknown state"
	ReasonStale        = "stale"
	ReasonDraining     = "draining"
	ReasonNoSlots      = "no slots"
)

// PoolStats aggregates one pool of a model. Slots, EffectiveSlots, Active
// and Free sum over the eligible agents only; Agents counts all of them.
type PoolStats struct {
	Pool           Pool
	Agents         int
	Eligible       int
	Slots          int
	EffectiveSlots float64
	Active         int
	Free           float64
}

// Need is what a request requires of its route.
type Need struct {
	// NoPD is set when the PD pipeline cannot serve the request, for
	// example n > 1 with vLLM PD. Such a request goes to regular or fails
	// with ErrUnsupported; it is never sent to PD by chance.
	NoPD bool
	// Reason says why, for the error (e.g. "n > 1 is not supported by PD").
	Reason string
}

// Model is an immutable snapshot of one model's agents with the routing
// decision precomputed. Build a new one with NewModel whenever heartbeats
// change and on a timer (freshness and slow start depend on the time), and
// publish it through a Table; readers never lock.
type Model struct {
	name       string
	mode       Mode
	at         time.Time
	agents     []AgentView
	pools      [numPools]PoolStats
	pdEligible bool
	saturated  bool
	wRegular   float64
	wPD        float64
	// pdBelow: a decision goes to PD when the top 53 bits of r are below
	// it; 0 never, 1<<53 always.
	pdBelow uint64

	errNoCapacity  error
	errUnsupported error
}

// NewModel builds the snapshot of model name from its agents at time now.
// All the work of a decision is done here, once. cfg should have passed
// Validate; out-of-range values are clamped rather than refused, so a bad
// value cannot stop dispatch. agents is copied.
func NewModel(name string, agents []Agent, now time.Time, cfg Config) *Model {
	cfg = cfg.normalized()
	m := &Model{
		name:   name,
		mode:   cfg.Mode,
		at:     now,
		agents: make([]AgentView, len(agents)),
	}
	for p := range m.pools {
		m.pools[p].Pool = Pool(p)
	}
	for i, a := range agents {
		v := view(a, now, cfg)
		m.agents[i] = v
		if a.Pool >= numPools {
			continue
		}
		ps := &m.pools[a.Pool]
		ps.Agents++
		if !v.Eligible {
			continue
		}
		ps.Eligible++
		ps.Slots += a.Slots
		ps.EffectiveSlots += v.EffectiveSlots
		ps.Active += max(a.Active, 0)
		ps.Free += v.Free
	}

	reg, pre, dec := &m.pools[PoolRegular], &m.pools[PoolPrefill], &m.pools[PoolDecode]
	m.pdEligible = pre.Eligible > 0 && dec.Eligible > 0
	switch cfg.Mode {
	case ModeCount:
		m.wRegular = float64(reg.Eligible)
		if m.pdEligible {
			m.wPD = float64(pre.Eligible + dec.Eligible)
		}
	case ModePaired:
		m.wRegular = float64(reg.Eligible)
		if m.pdEligible {
			m.wPD = 2 * float64(min(pre.Eligible, dec.Eligible))
		}
	default: // ModeCapacity
		m.wRegular = reg.Free
		if m.pdEligible {
			m.wPD = 2 * min(pre.Free, dec.Free)
		}
		if m.wRegular+m.wPD == 0 {
			// Every route is full: keep filling the queues in proportion
			// to capacity instead of refusing. Effective slots of an
			// eligible agent are at least 1, so this is 0 only when no
			// route is eligible.
			m.saturated = reg.Eligible > 0 || m.pdEligible
			m.wRegular = reg.EffectiveSlots
			if m.pdEligible {
				m.wPD = 2 * min(pre.EffectiveSlots, dec.EffectiveSlots)
			}
		}
	}

	switch sum := m.wRegular + m.wPD; {
	case m.wPD <= 0:
		m.pdBelow = 0
	case m.wRegular <= 0:
		m.pdBelow = 1 << 53
	default:
		t := uint64(math.Round(m.wPD / sum * (1 << 53)))
		m.pdBelow = min(max(t, 1), 1<<53-1) // both routes keep a chance
	}

	m.errNoCapacity = &decideError{sentinel: ErrNoCapacity, model: name}
	m.errUnsupported = &decideError{sentinel: ErrUnsupported, model: name}
	return m
}

// view decides one agent's eligibility and effective slots.
func view(a Agent, now time.Time, cfg Config) AgentView {
	v := AgentView{Agent: a}
	switch {
	case a.Pool >= numPools:
		v.Reason = ReasonUnknownPool
	case !fresh(a, now, cfg.MissedHeartbeats):
		v.Reason = ReasonStale
	case a.State == StateDraining:
		v.Reason = ReasonDraining
	case a.State >= numStates:
		v.Reason = ReasonUnknownState
	case a.Slots <= 0:
		v.Reason = ReasonNoSlots
	}
	if v.Reason != "" {
		return v
	}
	v.Eligible = true
	if a.State == StateWarming {
		v.EffectiveSlots = min(max(cfg.SlowStartFloor*float64(a.Slots), 1), float64(a.Slots))
	} else {
		v.EffectiveSlots = Ramp(a.Slots, a.ReadySince, now, cfg)
	}
	v.Free = max(v.EffectiveSlots-float64(max(a.Active, 0)), 0)
	return v
}

// Ramp returns the effective slots of an agent with slots that became
// ready at readySince: they ramp linearly from the slow-start floor (at
// least one slot) to slots over cfg.SlowStart. With no ramp configured, or
// an agent that does not say when it became ready, it is slots: trusted
// rather than starved forever. Agents use it to bound what they pull, the
// broker to weigh them, so both count the same slots.
func Ramp(slots int, readySince, now time.Time, cfg Config) float64 {
	cfg = cfg.normalized()
	s := float64(slots)
	if slots <= 0 {
		return 0
	}
	if cfg.SlowStart <= 0 || readySince.IsZero() {
		return s
	}
	floor := min(max(cfg.SlowStartFloor*s, 1), s)
	switch elapsed := now.Sub(readySince); {
	case elapsed <= 0:
		return floor
	case elapsed >= cfg.SlowStart:
		return s
	default:
		return floor + (s-floor)*float64(elapsed)/float64(cfg.SlowStart)
	}
}

// fresh reports whether a's last heartbeat is younger than missed
// intervals. A LastSeen in the future (clock skew) counts as fresh.
func fresh(a Agent, now time.Time, missed int) bool {
	iv := a.Interval
	if iv <= 0 {
		iv = time.Second
	}
	if iv > math.MaxInt64/time.Duration(missed) {
		return true // a window beyond any real age
	}
	return now.Sub(a.LastSeen) < time.Duration(missed)*iv
}

// Decide picks the route of one request. r is a uniformly random uint64
// from the caller (math/rand/v2's Uint64 in production, a seeded source in
// tests); a route is chosen with probability weight/sum of weights, using
// r's top 53 bits. Decide is O(1), allocation-free and lock-free, except
// that an ErrUnsupported carrying a non-empty Need.Reason costs one small
// allocation.
//
// Errors: ErrNoCapacity when no route has an eligible agent (also from a
// nil Model), ErrUnsupported when need.NoPD and only PD is eligible.
func (m *Model) Decide(need Need, r uint64) (Route, error) {
	if m == nil {
		return RouteRegular, ErrNoCapacity
	}
	if need.NoPD {
		switch {
		case m.pools[PoolRegular].Eligible > 0:
			return RouteRegular, nil
		case !m.pdEligible:
			return RouteRegular, m.errNoCapacity
		case need.Reason == "":
			return RouteRegular, m.errUnsupported
		}
		return RouteRegular, &decideError{sentinel: ErrUnsupported, model: m.name, reason: need.Reason}
	}
	if r>>11 < m.pdBelow {
		return RoutePD, nil
	}
	if m.wRegular > 0 {
		return RouteRegular, nil
	}
	return RouteRegular, m.errNoCapacity
}

// decideError is what Decide returns: a sentinel with the model and, for
// ErrUnsupported, the request's reason. It formats lazily, so building one
// is a single small allocation and returning a prebuilt one is free.
type decideError struct {
	sentinel      error
	model, reason string
}

func (e *decideError) Error() string {
	s := e.sentinel.Error() + ": model " + strconv.Quote(e.model)
	if e.sentinel == ErrUnsupported {
		s += " has no eligible regular agent and PD cannot serve this request"
	}
	if e.reason != "" {
		s += ": " + e.reason
	}
	return s
}

func (e *decideError) Unwrap() error { return e.sentinel }

// Name returns the model name the snapshot was built for.
func (m *Model) Name() string { return m.name }

// Mode returns the weight mode the snapshot was built with.
func (m *Model) Mode() Mode { return m.mode }

// At returns the time the snapshot was evaluated at.
func (m *Model) At() time.Time { return m.at }

// Weights returns the route weights; a decision goes to PD with
// probability pd/(regular+pd).
func (m *Model) Weights() (regular, pd float64) { return m.wRegular, m.wPD }

// Saturated reports whether capacity mode found every route full and fell
// back to weighting by total effective slots.
func (m *Model) Saturated() bool { return m.saturated }

// Eligible reports whether route has eligible agents: regular needs one
// regular agent, PD one prefill and one decode agent.
func (m *Model) Eligible(route Route) bool {
	switch route {
	case RouteRegular:
		return m.pools[PoolRegular].Eligible > 0
	case RoutePD:
		return m.pdEligible
	}
	return false
}

// Pool returns the aggregates of pool p (zero for an unknown pool).
func (m *Model) Pool(p Pool) PoolStats {
	if p >= numPools {
		return PoolStats{Pool: p}
	}
	return m.pools[p]
}

// Pools returns the aggregates of the three pools, in Pool order.
func (m *Model) Pools() []PoolStats {
	out := make([]PoolStats, numPools)
	copy(out, m.pools[:])
	return out
}

// Agents returns a copy of the per-agent views, in the order given to
// NewModel.
func (m *Model) Agents() []AgentView {
	out := make([]AgentView, len(m.agents))
	copy(out, m.agents)
	return out
}
