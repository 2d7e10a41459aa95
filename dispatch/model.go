package dispatch

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/switchyard-ai/switchyard/subjects"
)

// Agent is what the broker knows about one agent from its last heartbeat.
type Agent struct {
	ID     string
	Pool   Pool
	State  State
	Slots  int // max concurrent requests
	Active int // interactive requests in flight, as of its last heartbeat
	// Batch is the batch-class jobs it holds beside Active: work it gives
	// back to interactive work, so not counted against its slots.
	Batch      int
	ReadySince time.Time     // when it became ready; zero if never (or not reported)
	LastSeen   time.Time     // when the broker last heard it (its clock, less any time it could not listen)
	Interval   time.Duration // its heartbeat interval; 0 means 1s

	// PullLimit is the agent's own current bound on the jobs it holds (its
	// slow-start ramp, the heartbeat's pull_limit); 0 means not reported.
	// Effective slots never exceed it: the broker does not count on slots
	// the agent will not pull for.
	PullLimit int
	// EngineWaiting is the requests waiting in the engine's own queue, as
	// its engine reports them in the heartbeat (vllm:num_requests_waiting),
	// whichever broker sent them; 0 also when not reported. ModeSLO counts
	// them as prefill work queued on the agent.
	EngineWaiting int
	// PDProtocol is the hand-off protocol of a prefill or decode agent,
	// "vllm" or "sglang"; PDLabels the labels its operator declared must
	// match, in canonical form (subjects.CanonicalLabels), possibly "".
	// Together they are the agent's pairing (subjects.PairKey).
	PDProtocol string
	PDLabels   string
	// StateReason says why the agent does not serve, from its heartbeat
	// ("engine not healthy yet: ..."); shown in the view of a warming agent.
	StateReason string
	// Timing is what the broker learned of the agent's latency from the
	// chunks it relayed; ModeSLO predicts from it. The zero value is no
	// history.
	Timing Timing
}

// AgentView is an agent as a snapshot counts it, for the fleet view.
type AgentView struct {
	Agent
	// Pair is the agent's pairing key, subjects.PairKey(PDProtocol,
	// PDLabels), for prefill and decode agents; "" for regular ones.
	Pair           string
	Eligible       bool
	EffectiveSlots float64 // slots after slow start and PullLimit; 0 when not eligible
	Free           float64 // max(0, EffectiveSlots - Active)
	Reason         string  // why it is not eligible; "" when it is
}

// Reasons an agent is not eligible, as in AgentView.Reason. A warming agent
// that reports why has ReasonWarming + ": " + its StateReason; an agent
// without a partner has ReasonNoPartner + ": " + which partner is missing.
const (
	ReasonUnknownPool  = "unknown pool"
	ReasonUnknownState = "unknown state"
	ReasonStale        = "stale"
	ReasonDraining     = "draining"
	ReasonNoSlots      = "no slots"
	ReasonWarming      = "warming"
	ReasonNoPartner    = "no PD partner"
	// ReasonNoProtocol: a prefill or decode agent that does not say which
	// hand-off protocol it speaks has no pairing, hence no queue to pull.
	ReasonNoProtocol = "no PD protocol"
)

// PoolStats aggregates one pool of a model (of all pairings, for prefill
// and decode). Agents and Active count every agent in the table, so Active
// is all the work the pool holds, a draining agent's streams and an agent
// cut off from its PD partner included. Eligible, Slots, EffectiveSlots,
// EligibleActive and Free sum over the eligible agents only: what dispatch
// counts. Free is max(0, EffectiveSlots - EligibleActive) per pairing, from
// heartbeats alone (Decide also subtracts what the broker has seen since;
// see InFlight).
type PoolStats struct {
	Pool           Pool
	Agents         int
	Eligible       int
	Slots          int
	EffectiveSlots float64
	// Active is the jobs held by all the pool's agents, eligible or not.
	Active int
	// EligibleActive is the jobs held by its eligible agents.
	EligibleActive int
	Free           float64
	// Batch is the batch-class jobs its agents hold, beside Active.
	Batch int
}

// PairStats is one PD pairing of a model: its prefill and decode agents
// (Pool, counts and sums as in PoolStats), whether it is eligible (at least
// one eligible agent on each side) and its PD weight in the snapshot.
type PairStats struct {
	Key      string
	Prefill  PoolStats
	Decode   PoolStats
	Eligible bool
	Weight   float64
}

// Need is what a request requires of its route.
type Need struct {
	// NoPD is set when the PD pipeline cannot serve the request, for
	// example n > 1 with vLLM PD. Such a request goes to regular or fails
	// with ErrUnsupported; it is never sent to PD by chance.
	NoPD bool
	// Reason says why, for the error (e.g. "n > 1 is not supported by PD").
	Reason string

	// PromptTokens is the request's prompt length in tokens; 0 means
	// unknown, and ModeSLO and ModeThreshold then weigh by capacity.
	PromptTokens int
	// Cache says how much of the prompt each route already holds; nil
	// means nothing is cached anywhere.
	Cache PrefixCache
	// Targets are the request's latency targets for ModeSLO; zero means
	// none.
	Targets Targets
	// Guard makes ModeSLO decide by capacity (Decision.Fallback
	// FallbackGuard): the broker sets it while its predictions have been
	// off.
	Guard bool
	// NoProbe keeps ModeSLO from sending the request as a probe
	// (Config.ProbeShare): the broker sets it while its bound on the rate
	// of probes holds.
	NoProbe bool
}

// InFlight is what the broker knows that heartbeats do not show yet: the
// jobs dispatched since the agents' last heartbeats. Decide subtracts them
// from free slots, so weights react between heartbeats (and, when the
// broker counts from the job stream, to what other brokers sent).
type InFlight interface {
	// Outstanding returns for pool (pair is the pairing key for
	// prefill/decode, "" for regular) the jobs this broker dispatched that
	// no agent has taken yet (pending), and the jobs agents of that pool
	// took and still hold (active), as the broker counts them.
	Outstanding(pool Pool, pair string) (pending, active int)
}

// Decision is the outcome of Decide: the route and, for RoutePD, the
// pairing whose queues the request goes to ("" for regular).
type Decision struct {
	Route Route
	Pair  string
	// Predicted is set when ModeSLO chose the route by prediction, and
	// Prediction is then what it predicted for it; otherwise the decision
	// was by weight (or by threshold) and Prediction is zero.
	Predicted  bool
	Prediction Prediction
	// Probe: ModeSLO sent the request to a route its predictions avoid,
	// to learn the route's stale figures afresh (Config.ProbeShare);
	// Prediction is what it predicts there.
	Probe bool
	// Fallback says why ModeSLO decided by capacity instead (one of the
	// Fallback constants); "" when it predicted, or in other modes. With
	// FallbackGuard, Prediction is still what it predicts for the route
	// chosen, for the broker to score (Predicted is false).
	Fallback string
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
	pairs      []PairStats // sorted by Key
	pdEligible bool
	saturated  bool
	wRegular   float64
	wPD        float64
	// cands are the eligible routes Decide weighs: regular first (when
	// eligible), then the eligible pairings in Key order.
	cands []candidate
	// timed is set when every candidate has the learned timing ModeSLO
	// predicts from.
	timed bool
	// threshold is ModeThreshold's bound (Config.PDThreshold).
	threshold int
	// probeCut is Config.ProbeShare in 2048ths: a request whose random
	// number's low 11 bits are below it may be a probe; probeTokens is
	// Config.ProbeTokens.
	probeCut    uint64
	probeTokens int

	errNoCapacity  error
	errUnsupported error
}

// candidate is one route Decide may pick, with what its weight needs.
type candidate struct {
	route Route
	pair  string
	// static is the weight without InFlight: the mode's weight; in
	// capacity mode free slots by heartbeats, before the fall-back.
	static float64
	// fallback is the capacity mode's weight when every route is full:
	// effective slots (min of the two legs for PD).
	fallback float64
	legs     [2]leg // regular: legs[0]; PD: decode, prefill
	nlegs    int
	// stale: ModeSLO may probe the route (Config.ProbeAge, ProbeSamples);
	// fresh is the newest sample of its stalest leg, to probe the
	// stalest route first.
	stale bool
	fresh time.Time
}

// leg is one pool of a route, for the capacity weight and, in ModeSLO,
// the prediction.
type leg struct {
	pool Pool
	eff  float64
	// active is what the eligible agents' heartbeats hold; uncounted what
	// the pool's other agents (draining, stale, without partner) hold, so
	// that the broker's count of held jobs, which includes theirs, is not
	// charged to the eligible agents.
	active, uncounted int
	// fig is the pool's learned timing, over its eligible agents.
	fig figures
}

// load returns max(0, eff - max(heartbeat active, seen active) - seen
// pending), the leg's free slots, and the requests it holds or is about to
// (the larger active count plus pending).
func (l *leg) load(seen InFlight, pair string) (free float64, busy int) {
	act := l.active
	var pending int
	if seen != nil {
		var held int
		pending, held = seen.Outstanding(l.pool, pair)
		act = max(act, held-l.uncounted)
	}
	pending = max(pending, 0)
	return max(l.eff-float64(act)-float64(pending), 0), act + pending
}

// weight is the capacity weight of c under seen: a route is as wide as its
// narrowest leg (for PD the decode slots a request holds for its life,
// bounded by what prefill can feed). busy is what its first leg holds or
// is about to (see leg.load).
func (c *candidate) weight(seen InFlight) (w float64, busy int) {
	w, busy = c.legs[0].load(seen, c.pair)
	for i := 1; i < c.nlegs; i++ {
		f, _ := c.legs[i].load(seen, c.pair)
		w = min(w, f)
	}
	return w, busy
}

// NewModel builds the snapshot of model name from its agents at time now.
// All the work of a decision that does not depend on InFlight is done
// here, once. cfg should have passed Validate; out-of-range values are
// clamped rather than refused, so a bad value cannot stop dispatch. agents
// is copied.
func NewModel(name string, agents []Agent, now time.Time, cfg Config) *Model {
	cfg = cfg.normalized()
	m := &Model{
		name:      name,
		mode:      cfg.Mode,
		at:        now,
		agents:    make([]AgentView, len(agents)),
		threshold: cfg.PDThreshold,
	}
	if cfg.Mode == ModeSLO && cfg.ProbeShare > 0 {
		m.probeCut = max(uint64(math.Round(cfg.ProbeShare*probeSpan)), 1)
		m.probeTokens = cfg.ProbeTokens
	}
	for p := range m.pools {
		m.pools[p].Pool = Pool(p)
	}
	for i, a := range agents {
		m.agents[i] = view(a, now, cfg)
	}
	m.pair()

	var regUncounted int
	var regTiming timingSum
	// Per pairing, prefill then decode: what agents that do not count hold
	// (leg.uncounted) and the eligible agents' timing.
	perPair := make([]struct {
		uncounted [2]int
		timing    [2]timingSum
	}, len(m.pairs))
	for i := range m.agents {
		v := &m.agents[i]
		if v.Pool >= numPools {
			continue
		}
		var ps *PoolStats
		var unc *int
		var ts *timingSum
		if v.Pool == PoolRegular {
			ps, unc, ts = &m.pools[PoolRegular], &regUncounted, &regTiming
		} else {
			j := m.pairIndex(v.Pair)
			side := &m.pairs[j].Prefill
			unc, ts = &perPair[j].uncounted[0], &perPair[j].timing[0]
			if v.Pool == PoolDecode {
				side, unc, ts = &m.pairs[j].Decode, &perPair[j].uncounted[1], &perPair[j].timing[1]
			}
			add(side, v)
			ps = &m.pools[v.Pool]
		}
		add(ps, v)
		if !v.Eligible {
			*unc += max(v.Active, 0)
		} else {
			ts.add(v, now, cfg.TimingMaxAge)
		}
	}
	reg := &m.pools[PoolRegular]
	reg.Free = max(reg.EffectiveSlots-float64(reg.EligibleActive), 0)
	for i := range m.pairs {
		ps := &m.pairs[i]
		for _, side := range []*PoolStats{&ps.Prefill, &ps.Decode} {
			side.Free = max(side.EffectiveSlots-float64(side.EligibleActive), 0)
			m.pools[side.Pool].Free += side.Free
		}
	}

	m.cands = make([]candidate, 0, 1+len(m.pairs))
	if reg.Eligible > 0 {
		m.cands = append(m.cands, candidate{
			route: RouteRegular,
			legs:  [2]leg{{pool: PoolRegular, eff: reg.EffectiveSlots, active: reg.EligibleActive, uncounted: regUncounted, fig: regTiming.figures()}},
			nlegs: 1,
		})
	}
	for i := range m.pairs {
		ps := &m.pairs[i]
		if !ps.Eligible {
			continue
		}
		m.pdEligible = true
		m.cands = append(m.cands, candidate{
			route: RoutePD,
			pair:  ps.Key,
			legs: [2]leg{
				{pool: PoolDecode, eff: ps.Decode.EffectiveSlots, active: ps.Decode.EligibleActive, uncounted: perPair[i].uncounted[1], fig: perPair[i].timing[1].figures()},
				{pool: PoolPrefill, eff: ps.Prefill.EffectiveSlots, active: ps.Prefill.EligibleActive, uncounted: perPair[i].uncounted[0], fig: perPair[i].timing[0].figures()},
			},
			nlegs: 2,
		})
	}

	var sum float64
	for i := range m.cands {
		c := &m.cands[i]
		var p *PairStats
		if c.route == RoutePD {
			p = &m.pairs[m.pairIndex(c.pair)]
		}
		switch cfg.Mode {
		case ModeCount:
			if p == nil {
				c.static = float64(reg.Eligible)
			} else {
				c.static = float64(p.Prefill.Eligible + p.Decode.Eligible)
			}
			c.fallback = c.static
		case ModePaired:
			if p == nil {
				c.static = float64(reg.Eligible)
			} else {
				c.static = 2 * float64(min(p.Prefill.Eligible, p.Decode.Eligible))
			}
			c.fallback = c.static
		default: // ModeCapacity, and the frame of ModeSLO and ModeThreshold
			c.static, _ = c.weight(nil)
			c.fallback = c.legs[0].eff
			if c.nlegs == 2 {
				c.fallback = min(c.fallback, c.legs[1].eff)
			}
		}
		sum += c.static
	}
	// Every route full (capacity mode): keep filling the queues in
	// proportion to capacity instead of refusing. Effective slots of an
	// eligible agent are at least 1, so this happens only with something
	// eligible.
	m.saturated = sum == 0 && len(m.cands) > 0
	m.timed = len(m.cands) > 0
	for i := range m.cands {
		m.timed = m.timed && m.cands[i].timed()
		if m.probeCut > 0 {
			m.cands[i].staleness(now, cfg)
		}
	}
	for i := range m.cands {
		c := &m.cands[i]
		w := c.static
		if m.saturated {
			w = c.fallback
		}
		if c.route == RouteRegular {
			m.wRegular = w
		} else {
			m.wPD += w
			m.pairs[m.pairIndex(c.pair)].Weight = w
		}
	}

	m.errNoCapacity = &decideError{sentinel: ErrNoCapacity, model: name}
	m.errUnsupported = &decideError{sentinel: ErrUnsupported, model: name}
	return m
}

// add counts agent v in ps.
func add(ps *PoolStats, v *AgentView) {
	ps.Agents++
	ps.Active += max(v.Active, 0)
	ps.Batch += max(v.Batch, 0)
	if !v.Eligible {
		return
	}
	ps.Eligible++
	ps.Slots += v.Slots
	ps.EffectiveSlots += v.EffectiveSlots
	ps.EligibleActive += max(v.Active, 0)
}

// pair groups the prefill and decode agents by pairing key and takes
// eligibility away from those whose pairing has no eligible agent on the
// other side: a hand-off needs a partner of the same protocol and labels.
func (m *Model) pair() {
	type sides struct{ prefill, decode int }
	count := map[string]*sides{}
	for i := range m.agents {
		v := &m.agents[i]
		if v.Pool != PoolPrefill && v.Pool != PoolDecode {
			continue
		}
		s := count[v.Pair]
		if s == nil {
			s = &sides{}
			count[v.Pair] = s
		}
		if v.Eligible && v.Pool == PoolPrefill {
			s.prefill++
		} else if v.Eligible {
			s.decode++
		}
	}
	m.pairs = make([]PairStats, 0, len(count))
	for key, s := range count {
		m.pairs = append(m.pairs, PairStats{
			Key:      key,
			Prefill:  PoolStats{Pool: PoolPrefill},
			Decode:   PoolStats{Pool: PoolDecode},
			Eligible: s.prefill > 0 && s.decode > 0,
		})
	}
	slices.SortFunc(m.pairs, func(a, b PairStats) int { return cmp.Compare(a.Key, b.Key) })
	noPrefill := map[string]string{}
	noDecode := map[string]string{}
	for i := range m.agents {
		v := &m.agents[i]
		if !v.Eligible || (v.Pool != PoolPrefill && v.Pool != PoolDecode) {
			continue
		}
		if m.pairs[m.pairIndex(v.Pair)].Eligible {
			continue
		}
		// One string per pairing and side, shared by its agents.
		missing, cache := PoolDecode, noDecode
		if v.Pool == PoolDecode {
			missing, cache = PoolPrefill, noPrefill
		}
		r, ok := cache[v.Pair]
		if !ok {
			r = ReasonNoPartner + ": no ready " + missing.String() + " agent with pairing " + strconv.Quote(v.Pair)
			cache[v.Pair] = r
		}
		v.Eligible, v.EffectiveSlots, v.Free, v.Reason = false, 0, 0, r
	}
}

// pairIndex returns the index of key in m.pairs, which holds every key of
// the model's prefill and decode agents.
func (m *Model) pairIndex(key string) int {
	i, _ := slices.BinarySearchFunc(m.pairs, key, func(p PairStats, k string) int { return cmp.Compare(p.Key, k) })
	return i
}

// view decides one agent's eligibility and effective slots on its own;
// pairing is decided over all agents afterwards (see pair).
func view(a Agent, now time.Time, cfg Config) AgentView {
	v := AgentView{Agent: a}
	if a.Pool == PoolPrefill || a.Pool == PoolDecode {
		v.Pair = subjects.PairKey(a.PDProtocol, a.PDLabels)
	}
	switch {
	case a.Pool >= numPools:
		v.Reason = ReasonUnknownPool
	case !fresh(a, now, cfg.MissedHeartbeats):
		v.Reason = ReasonStale
	case a.State == StateDraining:
		v.Reason = ReasonDraining
	case a.State == StateWarming:
		// Its agent pulls no jobs until the engine is healthy, so a job
		// sent its way would wait in a queue nobody reads.
		v.Reason = ReasonWarming
		if a.StateReason != "" {
			v.Reason += ": " + a.StateReason
		}
	case a.State >= numStates:
		v.Reason = ReasonUnknownState
	case a.Slots <= 0:
		v.Reason = ReasonNoSlots
	case a.PDProtocol == "" && a.Pool != PoolRegular:
		v.Reason = ReasonNoProtocol
	}
	if v.Reason != "" {
		return v
	}
	v.Eligible = true
	v.EffectiveSlots = Ramp(a.Slots, a.ReadySince, now, cfg)
	if a.PullLimit > 0 {
		v.EffectiveSlots = min(v.EffectiveSlots, float64(a.PullLimit))
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

// below1 is the largest float64 below 1.
const below1 = 1 - 0x1p-53

// Decide picks the route of one request and, for PD, its pairing: one of
// [regular, pairing 1, pairing 2, ...] with probability proportional to its
// weight, or in ModeSLO and ModeThreshold by the request's prompt and
// targets within the routes that have free capacity (see the package doc).
// r is a uniformly random uint64 from the caller (math/rand/v2's Uint64 in
// production, a seeded source in tests); its top 53 bits are the one random
// number of the draw. seen, if not nil, is asked at most once per pool of
// each eligible route (in every mode but paired and count) for the jobs
// dispatched and held since the heartbeats; nil means the heartbeats are
// the whole truth. need.Cache, if not nil, is asked at most once per
// eligible route (ModeSLO and ModeThreshold only).
//
// Decide is O(eligible routes), allocation-free and lock-free, except that
// an ErrUnsupported carrying a non-empty Need.Reason costs one small
// allocation.
//
// Errors: ErrNoCapacity when no route has an eligible agent (also from a
// nil Model), ErrUnsupported when need.NoPD and only PD is eligible.
func (m *Model) Decide(need Need, seen InFlight, r uint64) (Decision, error) {
	if m == nil {
		return Decision{}, ErrNoCapacity
	}
	if need.NoPD {
		switch {
		case m.pools[PoolRegular].Eligible > 0:
			return Decision{Route: RouteRegular}, nil
		case !m.pdEligible:
			return Decision{}, m.errNoCapacity
		case need.Reason == "":
			return Decision{}, m.errUnsupported
		}
		return Decision{}, &decideError{sentinel: ErrUnsupported, model: m.name, reason: need.Reason}
	}
	u := float64(r>>11) * 0x1p-53
	chosen := -1
	var d Decision
	switch m.mode {
	case ModeSLO:
		chosen, d.Prediction, d.Fallback, d.Probe = m.decideSLO(&need, seen, u, r&(probeSpan-1))
		d.Predicted = chosen >= 0 && d.Fallback == "" && d.Prediction != (Prediction{})
	case ModeThreshold:
		chosen = m.decideThreshold(&need, seen, u)
	}
	if chosen < 0 {
		chosen = m.decideWeighted(seen, u)
	}
	if chosen < 0 {
		return Decision{}, m.errNoCapacity
	}
	c := &m.cands[chosen]
	d.Route, d.Pair = c.route, c.pair
	if d.Fallback == FallbackGuard {
		d.Prediction = m.shadow(c, &need, seen)
	}
	return d, nil
}

// decideWeighted is the weighted draw of ModeCapacity, ModePaired and
// ModeCount, and the frame of the other modes: the index of the chosen
// candidate, or -1 when there is none.
func (m *Model) decideWeighted(seen InFlight, u float64) int {
	live := seen != nil && m.mode.capacityFree()

	// One pass, one random number: each route with weight w replaces the
	// choice so far with probability w / (sum of weights up to it), and u
	// is rescaled to stay uniform on [0, 1) given that outcome. The last
	// choice standing has probability w / (sum of all weights), and seen is
	// asked about each pool once.
	chosen, sum := -1, 0.0
	for i := range m.cands {
		c := &m.cands[i]
		w := c.static
		if live {
			w, _ = c.weight(seen)
		}
		chosen, sum, u = step(i, w, chosen, sum, u)
	}
	if chosen < 0 {
		chosen = m.drawFallback(u)
	}
	return chosen
}

// drawFallback draws among all candidates by their fall-back weights:
// every route is full, so the queues fill in proportion to capacity.
func (m *Model) drawFallback(u float64) int {
	chosen, sum := -1, 0.0
	for i := range m.cands {
		chosen, sum, u = step(i, m.cands[i].fallback, chosen, sum, u)
	}
	return chosen
}

// step is one draw of Decide's weighted choice.
func step(i int, w float64, chosen int, sum, u float64) (int, float64, float64) {
	if !(w > 0) {
		return chosen, sum, u
	}
	sum += w
	p := w / sum
	if u < p {
		return i, sum, min(u/p, below1)
	}
	return chosen, sum, min((u-p)/(1-p), below1)
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

// Weights returns the route weights from heartbeats alone (Decide with a
// nil InFlight): regular, and PD summed over the eligible pairings. A
// decision goes to PD with probability pd/(regular+pd). In ModeSLO and
// ModeThreshold they are the capacity weights of their frame: what a
// request without targets (or prompt length) is drawn by.
func (m *Model) Weights() (regular, pd float64) { return m.wRegular, m.wPD }

// LiveWeights returns the weights Decide uses with seen: regular, the
// pairings (as Pairs, with Weight the live weight) and whether the
// capacity mode's fall-back to effective slots is in use (in ModeSLO and
// ModeThreshold, the capacity weights of their frame, as Weights). It
// allocates; it is for views and metrics, not the request path.
func (m *Model) LiveWeights(seen InFlight) (regular float64, pairs []PairStats, saturated bool) {
	pairs = m.Pairs()
	if seen == nil || !m.mode.capacityFree() {
		return m.wRegular, pairs, m.saturated
	}
	ws := make([]float64, len(m.cands))
	var sum float64
	for i := range m.cands {
		ws[i], _ = m.cands[i].weight(seen)
		sum += ws[i]
	}
	saturated = sum == 0 && len(m.cands) > 0
	for i := range m.cands {
		c := &m.cands[i]
		w := ws[i]
		if saturated {
			w = c.fallback
		}
		if c.route == RouteRegular {
			regular = w
		} else {
			pairs[m.pairIndex(c.pair)].Weight = w
		}
	}
	return regular, pairs, saturated
}

// Saturated reports whether capacity mode found every route full by
// heartbeats and fell back to weighting by effective slots.
func (m *Model) Saturated() bool { return m.saturated }

// Eligible reports whether route has eligible agents: regular needs one
// regular agent, PD one prefill and one decode agent of the same pairing.
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

// Pairs returns a copy of the model's PD pairings, sorted by Key: every
// pairing key any prefill or decode agent reports, eligible or not.
func (m *Model) Pairs() []PairStats { return slices.Clone(m.pairs) }

// AgentsView returns the snapshot's agents without copying them, for hot
// paths that only read (the broker's affinity choice). Callers must not
// modify the slice.
func (m *Model) AgentsView() []AgentView {
	if m == nil {
		return nil
	}
	return m.agents
}

// Agents returns a copy of the per-agent views, in the order given to
// NewModel.
func (m *Model) Agents() []AgentView {
	out := make([]AgentView, len(m.agents))
	copy(out, m.agents)
	return out
}
