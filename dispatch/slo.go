package dispatch

import (
	"math"
	"time"
)

// Timing is what the broker learned of one agent's latency from the chunks
// it relays (it sees every job taken and every token arrive), as moving
// averages the broker maintains; it needs no engine metrics. The broker
// fills it in the Agent it passes to NewModel, so a snapshot carries the
// figures as of its build.
//
// What each figure measures depends on the agent's pool:
//
//	            TTFT                               ITL                 QueueWait        PrefillRate                    OutputTokens
//	regular     job published to first token       between tokens      published→taken  prompt tokens / prefill time   tokens per request
//	prefill     job published to hand-off          -                   published→taken  prompt tokens / prefill time   -
//	decode      hand-off to first token            between tokens      -                -                              tokens per request
//
// where prefill time is TTFT less QueueWait, and the prompt tokens are the
// ones the engine had to prefill (not cached). A decode agent's TTFT is the
// cost of the PD hop: the decode queue, the KV transfer and the first
// step. ModeSLO uses QueueWait, PrefillRate, ITL and OutputTokens of
// regular agents, QueueWait and PrefillRate of prefill agents, and TTFT
// and ITL of decode agents; a regular agent's TTFT and a decode agent's
// OutputTokens are for views.
type Timing struct {
	// Samples is how many requests the figures are drawn from; 0 is no
	// history, and the other fields are ignored.
	Samples int
	// Updated is when the last sample arrived, on the broker's clock.
	// Figures older than Config.TimingMaxAge count as no history; a zero
	// Updated is not aged.
	Updated   time.Time
	TTFT      time.Duration
	ITL       time.Duration
	QueueWait time.Duration
	// PrefillRate is prefill throughput in prompt tokens per second: the
	// prompt tokens the engine reported it prefilled (not cached) over the
	// agent's time with prefill work; 0 means not known.
	PrefillRate float64
	// PrefillTokens is the prompt tokens the engine prefilled per request,
	// on average: the work a request waiting for its prefill stands for.
	PrefillTokens float64
	// InPrefill is the requests the agent has taken whose prefill has not
	// ended (no first token, or no hand-off, yet), as of the snapshot:
	// prefill work already inside the engine, ahead of a new request.
	// ModeSLO counts the larger of it and Agent.EngineWaiting.
	InPrefill int
	// CacheUnreported: the engine's answers do not report their cached
	// prompt tokens (usage.prompt_tokens_details.cached_tokens), so what it
	// prefilled is not known and no PrefillRate is learned; ModeSLO then
	// decides by capacity.
	CacheUnreported bool
	// OutputTokens is how many tokens a request streams from the agent,
	// on average; 0 means not known.
	OutputTokens float64
}

// Targets are a request's latency targets; a zero field is no target.
type Targets struct {
	TTFT time.Duration // time to first token
	// ITL is the mean time per output token after the first (TPOT).
	ITL time.Duration
}

// PrefixCache says how much of one request's prompt is already cached
// where it could go. The broker answers it from its prefix-affinity tree;
// an implementation should not allocate (a pointer to the request's state,
// for example), as Decide calls it on the request path.
type PrefixCache interface {
	// Cached returns the longest prefix of the prompt, in tokens, that an
	// agent of pool holds: PoolRegular (pair ""), or PoolPrefill of the PD
	// pairing pair. Values outside [0, Need.PromptTokens] are clamped.
	Cached(pool Pool, pair string) int
}

// Prediction is what ModeSLO predicted for a route: the request's time to
// first token and the inter-token latency on it.
type Prediction struct {
	TTFT time.Duration
	ITL  time.Duration
	// Headroom is the smallest of (target − predicted) / target over the
	// request's targets: at least 0 when the route is predicted to meet
	// them all, and otherwise minus the relative miss of the worst one.
	Headroom float64
}

// figures is one leg's timing over its eligible agents, in seconds and
// tokens per second. samples is 0 when no agent has fresh figures.
type figures struct {
	samples         int
	ttft, itl, wait float64
	rate, out       float64
	// agents is how many agents the figures are drawn from; toks is the
	// prompt tokens prefilled per request; unreported counts the agents
	// whose engines report no cached prompt tokens.
	agents     int
	toks       float64
	unreported int
	// inPrefill is the requests the leg's agents hold in prefill.
	inPrefill int
	// newest is when the newest sample of the leg arrived; zero when an
	// agent's Updated is not reported.
	newest time.Time
}

// timingSum accumulates the fresh Timing of a leg's eligible agents,
// weighted by effective slots: a request lands on one agent, more likely
// on one with more room.
type timingSum struct {
	samples            int
	agents, unreported int
	inPrefill          int
	w, ttft, itl, wait float64
	wRate, rate, toks  float64
	wOut, out          float64
	newest             time.Time
}

func (s *timingSum) add(v *AgentView, now time.Time, maxAge time.Duration) {
	t := &v.Timing
	if t.Samples <= 0 || (maxAge > 0 && !t.Updated.IsZero() && now.Sub(t.Updated) >= maxAge) {
		return
	}
	w := v.EffectiveSlots
	if t.Updated.After(s.newest) {
		s.newest = t.Updated
	}
	s.samples += t.Samples
	s.agents++
	// What the engine reports waiting includes other brokers' requests;
	// what this broker saw taken includes those already being prefilled.
	s.inPrefill += max(t.InPrefill, v.EngineWaiting, 0)
	if t.CacheUnreported {
		s.unreported++
	}
	s.w += w
	s.ttft += w * max(t.TTFT, 0).Seconds()
	s.itl += w * max(t.ITL, 0).Seconds()
	s.wait += w * max(t.QueueWait, 0).Seconds()
	if t.PrefillRate > 0 && !math.IsInf(t.PrefillRate, 1) {
		s.wRate += w
		s.rate += w * t.PrefillRate
		s.toks += w * max(t.PrefillTokens, 0)
	}
	if t.OutputTokens > 0 && !math.IsInf(t.OutputTokens, 1) {
		s.wOut += w
		s.out += w * t.OutputTokens
	}
}

func (s *timingSum) figures() figures {
	if s.samples == 0 || !(s.w > 0) {
		return figures{}
	}
	f := figures{samples: s.samples, ttft: s.ttft / s.w, itl: s.itl / s.w, wait: s.wait / s.w, agents: s.agents, unreported: s.unreported, newest: s.newest, inPrefill: s.inPrefill}
	if s.wRate > 0 {
		f.rate = s.rate / s.wRate
		f.toks = s.toks / s.wRate
	}
	if s.wOut > 0 {
		f.out = s.out / s.wOut
	}
	return f
}

// timed reports whether c's legs have the figures its prediction needs:
// history everywhere, a prefill rate where the prompt is prefilled, and
// the regular pool's output length.
func (c *candidate) timed() bool {
	if c.route == RouteRegular {
		f := &c.legs[0].fig
		return f.samples > 0 && f.rate > 0 && f.out > 0
	}
	return c.legs[0].fig.samples > 0 && c.legs[1].fig.samples > 0 && c.legs[1].fig.rate > 0
}

// unreported reports whether c lacks a prefill rate because its prefill
// leg's engines report no cached prompt tokens.
func (c *candidate) unreported() bool {
	f := &c.legs[0].fig
	if c.route == RoutePD {
		f = &c.legs[1].fig
	}
	return f.rate == 0 && f.unreported > 0
}

// uncached returns the prompt tokens of need not cached on pool (and
// pair): what an engine there has to prefill.
func (need *Need) uncached(pool Pool, pair string) float64 {
	p := need.PromptTokens
	if need.Cache == nil {
		return float64(p)
	}
	return float64(p - min(max(need.Cache.Cached(pool, pair), 0), p))
}

// predict returns c's predicted TTFT and ITL in seconds for need. busy is
// what c's first leg holds or is about to (leg.load).
//
// An engine runs batch steps; a step costs about
//
//	base + perSeq × running sequences + perToken × prefill tokens in it
//
// The broker cannot see base or perSeq, but the learned ITL is the mean
// time per output token as it is (the stalls of the prefills already
// running included), and 1 / PrefillRate is perToken. So, with P the
// request's uncached prompt tokens on the route and N the regular pool's
// output tokens per request:
//
//	regular  TTFT = QueueWait + P / PrefillRate
//	         ITL  = ITL + (P / PrefillRate) / N   when the pool is busy
//	PD       TTFT = prefill QueueWait + P / prefill PrefillRate + decode TTFT
//	         ITL  = decode ITL
//
// On regular, the request's prefill rides in the steps of the decodes
// running beside it and delays each of them by P / PrefillRate in all,
// however it is chunked: spread over a stream's N tokens, that is what it
// adds to their time per output token, the figure the target bounds. An
// idle regular pool has no decodes to stall. A decode pool runs no
// prefills, and its TTFT is the PD hop (queue, KV transfer, first step).
//
// The rate is the engine's prefill throughput, so a prompt waits for the
// prefill work ahead of it on its agent too: Q, the requests sent to the
// prefill leg and not yet past their prefill there (on regular, those not
// yet taken and those its agents hold in prefill, Timing.InPrefill or
// the engine's reported waiting requests where more; on a prefill pool,
// every one it holds), each of the leg's
// mean prefilled tokens, spread over the leg's agents, adds
// Q × tokens / agents / PrefillRate. What a route was just sent thus moves
// its prediction at once, before any figure is learned.
func (c *candidate) predict(need *Need, busy, queued int) (ttft, itl float64) {
	if c.route == RouteRegular {
		f := &c.legs[0].fig
		p := need.uncached(PoolRegular, "") + f.queued(queued)
		ttft = f.wait + p/f.rate
		itl = f.itl
		if busy > 0 {
			itl += p / f.rate / f.out
		}
		return ttft, itl
	}
	d, pf := &c.legs[0].fig, &c.legs[1].fig
	p := need.uncached(PoolPrefill, c.pair) + pf.queued(queued)
	return pf.wait + p/pf.rate + d.ttft, d.itl
}

// stall returns how long need's prefill holds up the streams decoding on
// regular candidate c, in seconds.
func (c *candidate) stall(need *Need) float64 {
	return need.uncached(PoolRegular, "") / c.legs[0].fig.rate
}

// queued returns the prompt tokens that q requests waiting for their
// prefill on the leg stand for, per agent.
func (f *figures) queued(q int) float64 {
	if q <= 0 || f.agents <= 0 {
		return 0
	}
	return float64(q) * f.toks / float64(f.agents)
}

// queued returns the requests waiting for their prefill on c's prefill
// leg: on regular the ones sent and not taken yet and the ones the
// agents hold whose prefill has not ended (Timing.InPrefill: the engine
// prefills them before a new request, or in the same steps); on PD the
// prefill pool's whole load (a prefill agent holds a job only until its
// hand-off).
func (c *candidate) queued(seen InFlight) int {
	if c.route == RouteRegular {
		q := c.legs[0].fig.inPrefill
		if seen == nil {
			return q
		}
		pending, _ := seen.Outstanding(PoolRegular, "")
		return q + max(pending, 0)
	}
	_, busy := c.legs[1].load(seen, c.pair)
	return busy
}

// headroom is the smallest (target − predicted) / target over the targets
// t sets; +Inf when it sets none.
func headroom(t Targets, ttft, itl float64) float64 {
	h := math.Inf(1)
	if t.TTFT > 0 {
		s := t.TTFT.Seconds()
		h = min(h, (s-ttft)/s)
	}
	if t.ITL > 0 {
		s := t.ITL.Seconds()
		h = min(h, (s-itl)/s)
	}
	return h
}

// Reasons ModeSLO decided by capacity, as in Decision.Fallback.
const (
	FallbackNoTargets  = "no_targets"      // the request has no targets or no known prompt length
	FallbackNoHistory  = "no_history"      // some route has no fresh figures yet
	FallbackUnreported = "unreported"      // a route's engines report no cached prompt tokens
	FallbackGuard      = "predictions_off" // the broker found the predictions off (Need.Guard)
)

// sloMargin is the headroom a regular route must keep to be preferred:
// the cheaper route (one engine, no KV transfer) when it is predicted to
// meet the targets with that margin and the request's prefill, one stall
// of the streams running beside it, is within the ITL target.
const sloMargin = 0.25

// decideSLO is ModeSLO: a regular candidate with free capacity predicted
// to meet the targets with sloMargin to spare, without stalling its
// running streams past the ITL target, the cheapest route; failing
// that, among the candidates with free capacity, the one with the most
// headroom (which, when none meets the targets, is the one that misses
// least); equal headroom is drawn by capacity weight. It returns -1 and
// the reason, without asking seen, when the request has no targets or no
// prompt length, some route has no history or no engine-reported prefill
// rate, or need.Guard is set, so that Decide weighs by capacity instead.
// When every route is full it draws by the capacity fall-back, as
// ModeCapacity does.
//
// A probe: when low, the low bits of the random number, is below
// m.probeCut, the prompt is at most m.probeTokens long and need.NoProbe
// is not set, the request
// goes instead to a stale route (candidate.stale) with free capacity
// that it would not have gone to, the stalest first, so that the route's
// figures are learned again; the last result is then true.
func (m *Model) decideSLO(need *Need, seen InFlight, u float64, low uint64) (int, Prediction, string, bool) {
	t := need.Targets
	switch {
	case (t.TTFT <= 0 && t.ITL <= 0) || need.PromptTokens <= 0:
		return -1, Prediction{}, FallbackNoTargets, false
	case need.Guard:
		return -1, Prediction{}, FallbackGuard, false
	case !m.timed:
		for i := range m.cands {
			if m.cands[i].unreported() {
				return -1, Prediction{}, FallbackUnreported, false
			}
		}
		return -1, Prediction{}, FallbackNoHistory, false
	}
	probing := low < m.probeCut && need.PromptTokens <= m.probeTokens && !need.NoProbe
	probe := -1
	var probePred Prediction
	chosen, sum := -1, 0.0
	best := math.Inf(-1)
	var pred Prediction
	for i := range m.cands {
		c := &m.cands[i]
		w, busy := c.weight(seen)
		if !(w > 0) {
			continue
		}
		ttft, itl := c.predict(need, busy, c.queued(seen))
		h := headroom(t, ttft, itl)
		if math.IsNaN(h) {
			continue
		}
		if probing && c.stale && (probe < 0 || c.fresh.Before(m.cands[probe].fresh)) {
			probe, probePred = i, Prediction{TTFT: seconds(ttft), ITL: seconds(itl), Headroom: h}
		}
		// Headroom is at most 1: a regular route with the margin ranks
		// above every PD one.
		rank := h
		if c.route == RouteRegular && h >= sloMargin && (t.ITL <= 0 || c.stall(need) <= t.ITL.Seconds()) {
			rank = h + 2
		}
		if rank < best {
			continue
		}
		if rank > best {
			best, chosen, sum = rank, -1, 0
		}
		if chosen, sum, u = step(i, w, chosen, sum, u); chosen == i {
			pred = Prediction{TTFT: seconds(ttft), ITL: seconds(itl), Headroom: h}
		}
	}
	if chosen < 0 {
		return m.drawFallback(u), Prediction{}, "", false
	}
	if probe >= 0 && probe != chosen {
		return probe, probePred, "", true
	}
	return chosen, pred, "", false
}

// probeSpan is the resolution of Config.ProbeShare: Decide draws a probe
// from the low 11 bits of its random number, which the weighted draw
// (the top 53) leaves unused.
const probeSpan = 1 << 11

// staleness sets c.stale and c.fresh from its legs' figures.
func (c *candidate) staleness(now time.Time, cfg Config) {
	for i := 0; i < c.nlegs; i++ {
		f := &c.legs[i].fig
		if f.samples < cfg.ProbeSamples {
			c.stale = true
		}
		if f.newest.IsZero() {
			continue
		}
		if cfg.ProbeAge > 0 && now.Sub(f.newest) >= cfg.ProbeAge {
			c.stale = true
		}
		if c.fresh.IsZero() || f.newest.Before(c.fresh) {
			c.fresh = f.newest
		}
	}
}

// shadow returns what ModeSLO predicts for c, the route capacity chose
// while the broker's guard holds, so that its predictions go on being
// scored; zero when c lacks figures.
func (m *Model) shadow(c *candidate, need *Need, seen InFlight) Prediction {
	if !c.timed() || need.PromptTokens <= 0 {
		return Prediction{}
	}
	_, busy := c.weight(seen)
	ttft, itl := c.predict(need, busy, c.queued(seen))
	return Prediction{TTFT: seconds(ttft), ITL: seconds(itl), Headroom: headroom(need.Targets, ttft, itl)}
}

// seconds converts s to a Duration, saturating.
func seconds(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// decideThreshold is ModeThreshold: PD when the prompt tokens not cached
// on regular exceed m.threshold, else regular; within the chosen route,
// its candidates by capacity weight. When the chosen route has no free
// capacity (or no eligible agent) the other one with free capacity takes
// the request; when neither has, the chosen one does, by the capacity
// fall-back (its queues do the back-pressure), or the other when the
// chosen one is not eligible at all. It returns -1, without asking seen,
// when the prompt length is unknown.
func (m *Model) decideThreshold(need *Need, seen InFlight, u float64) int {
	if need.PromptTokens <= 0 {
		return -1
	}
	want, other := RouteRegular, RoutePD
	if need.uncached(PoolRegular, "") > float64(m.threshold) {
		want, other = RoutePD, RouteRegular
	}
	if i := m.drawRoute(want, seen, false, u); i >= 0 {
		return i
	}
	if i := m.drawRoute(other, seen, false, u); i >= 0 {
		return i
	}
	if i := m.drawRoute(want, nil, true, u); i >= 0 {
		return i
	}
	return m.drawRoute(other, nil, true, u)
}

// drawRoute draws among the candidates of route by their free capacity
// under seen, or by their fall-back weight: the index, or -1 when none
// weighs anything.
func (m *Model) drawRoute(route Route, seen InFlight, fallback bool, u float64) int {
	chosen, sum := -1, 0.0
	for i := range m.cands {
		c := &m.cands[i]
		if c.route != route {
			continue
		}
		w := c.fallback
		if !fallback {
			w, _ = c.weight(seen)
		}
		chosen, sum, u = step(i, w, chosen, sum, u)
	}
	return chosen
}
