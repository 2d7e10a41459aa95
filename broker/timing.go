package broker

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// Targets are a request's latency targets (see dispatch.Targets): an
// alias, so ingresses set them without importing dispatch.
type Targets = dispatch.Targets

// What the broker learns of each agent's latency from the chunks it
// relays (see dispatch.Timing for what each figure means per pool):
// moving averages, each new observation weighing timingAlpha. A stream's
// gaps between tokens are summed in its call and folded into its agent's
// figure every itlFoldEvery gaps and at its end, so a token costs no lock.
//
// Prefill figures fold per prefillWindow of an agent's busy time rather
// than per request: the requests whose prefills end in the same engine
// step share that step's time, and the first of them carries it all, so
// per-request samples would swing between a step's time and none.
const (
	timingAlpha   = 0.2
	itlFoldEvery  = 16
	prefillWindow = 1.0 // seconds
)

// ewma is one exponentially weighted moving average; set tells whether it
// has seen a value (the first one is taken as it is).
type ewma struct {
	v   float64
	set bool
}

func (e *ewma) add(x float64) {
	if !e.set {
		e.v, e.set = x, true
		return
	}
	e.v += timingAlpha * (x - e.v)
}

// agentTiming is one agent's learned figures, in seconds. The prefill
// rate is kept as the averages of prompt tokens and of prefill seconds,
// whose ratio weighs a long prompt more than a short one, whose prefill
// time is mostly the engine's step overhead.
//
// The prompt tokens are the ones the engine reports it prefilled (its
// usage's prompt_tokens less prompt_tokens_details.cached_tokens), not
// what the broker's affinity tree believed it held. The prefill seconds
// are the agent's busy time: the time during which it held at least one
// request in prefill, shared out among the requests that ended their
// prefill in it, so that prompts prefilled together in one engine step,
// or waiting in the engine's own queue behind others, are not each
// charged the whole time. The ratio is the engine's prefill throughput,
// which a congested agent and an idle one both measure.
type agentTiming struct {
	samples     int
	updated     time.Time
	ttft, itl   ewma
	wait        ewma
	prefillToks ewma
	prefillSecs ewma
	// reqToks is the prompt tokens prefilled per request (prefillToks is
	// per window of busy time, which holds many requests).
	reqToks ewma
	output  ewma // tokens per request streamed
	// unreported: the engine's last answer said nothing of cached prompt
	// tokens, so what it prefilled is not known and no rate is learned.
	unreported bool
	// inPrefill is the requests accepted by the agent whose prefill has
	// not ended; busySince is when the current busy spell, or its last
	// share, began; busyAcc is busy time not yet shared out.
	inPrefill int
	busySince time.Time
	busyAcc   float64
	// accToks and accSecs gather requests' prefilled tokens and busy
	// shares until prefillWindow of busy time, then fold as one sample
	// (the first one at once).
	accToks, accSecs float64
}

// prefillBegan counts a request entering prefill on the agent at now.
func (t *agentTiming) prefillBegan(now time.Time) {
	if t.inPrefill == 0 {
		t.busySince = now
	}
	t.inPrefill++
}

// prefillEnded counts a request leaving prefill at now and returns the
// busy seconds since the last request that left: its share.
func (t *agentTiming) prefillEnded(now time.Time) float64 {
	if t.inPrefill <= 0 {
		return 0
	}
	secs := t.busyAcc + max(now.Sub(t.busySince).Seconds(), 0)
	t.busyAcc, t.busySince = 0, now
	t.inPrefill--
	return secs
}

// prefillAbandoned counts a request leaving prefill at now without a first
// token (an error, a cancel): its busy time stays for the next one.
func (t *agentTiming) prefillAbandoned(now time.Time) {
	if t.inPrefill <= 0 {
		return
	}
	t.busyAcc += max(now.Sub(t.busySince).Seconds(), 0)
	t.busySince = now
	t.inPrefill--
}

func (t *agentTiming) timing() dispatch.Timing {
	out := dispatch.Timing{
		Samples:   t.samples,
		Updated:   t.updated,
		TTFT:      secondsDuration(t.ttft.v),
		ITL:       secondsDuration(t.itl.v),
		QueueWait: secondsDuration(t.wait.v),
	}
	if t.prefillSecs.v > 0 {
		out.PrefillRate = t.prefillToks.v / t.prefillSecs.v
		out.PrefillTokens = t.reqToks.v
	}
	out.InPrefill = t.inPrefill
	out.CacheUnreported = t.unreported
	out.OutputTokens = t.output.v
	return out
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// timings is what the broker learned per agent, and how often requests
// with targets met them, per route. Lock order: Broker.mu before
// timings.mu (rebuild copies the figures into the snapshot's agents).
type timings struct {
	mu     sync.Mutex
	agents map[agentKey]*agentTiming
	// changed holds the models with figures updated since takeChanged:
	// their snapshots are rebuilt with the new figures.
	changed map[string]struct{}
	// attainment counts per (model, route) the requests with targets
	// that met them ([0]) or missed them ([1]).
	attainment sync.Map // obsKey -> *attainment
}

type attainment struct {
	counts   [2]atomic.Uint64
	counters [2]prometheus.Counter
}

// observe runs f on the figures of model's agent id under the lock and
// marks them updated at now; a sample is a request's first-leg figure.
func (t *timings) observe(model, id string, now time.Time, sample bool, f func(*agentTiming)) {
	if id == "" {
		return
	}
	t.mu.Lock()
	a := t.agents[agentKey{model, id}]
	if a == nil {
		if t.agents == nil {
			t.agents = make(map[agentKey]*agentTiming)
		}
		a = new(agentTiming)
		// Cloned: id may be a chunk's, aliasing its whole message.
		t.agents[agentKey{model, strings.Clone(id)}] = a
	}
	f(a)
	if sample {
		a.samples++
	}
	a.updated = now
	if t.changed == nil {
		t.changed = make(map[string]struct{})
	}
	if _, ok := t.changed[model]; !ok {
		t.changed[strings.Clone(model)] = struct{}{}
	}
	t.mu.Unlock()
}

// takeChanged returns the models with figures updated since the last
// call. The caller may hold Broker.mu.
func (t *timings) takeChanged() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.changed))
	for m := range t.changed {
		out = append(out, m)
	}
	clear(t.changed)
	return out
}

// of returns what was learned of model's agent id; the zero Timing when
// nothing was. The caller may hold Broker.mu.
func (t *timings) of(model, id string) dispatch.Timing {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.agents[agentKey{model, id}]; a != nil {
		return a.timing()
	}
	return dispatch.Timing{}
}

// drop forgets an agent that left the table.
func (t *timings) drop(k agentKey) {
	t.mu.Lock()
	delete(t.agents, k)
	t.mu.Unlock()
}

// callTiming is one call's part in the learning, owned by its reader. Its
// per-attempt fields are reset by need, at each dispatch.
type callTiming struct {
	model *dispatch.Model // the snapshot the attempt was decided on
	// tokens is the prompt's length in tokens, estimated from its block
	// keys; 0: unknown.
	tokens int
	// prefilling is the first leg's agent while the attempt counts in its
	// prefill (accepted, no first token or hand-off yet); prefillSecs is
	// the attempt's share of that agent's busy time, kept until the
	// engine's usage says how many tokens it prefilled.
	prefilling  string
	prefillSecs float64
	// predicted is the TTFT slo predicted for the attempt's route (its
	// publish to first token), scored at its first token; predictedITL
	// the ITL, scored when the request ends well; 0: none.
	predicted, predictedITL time.Duration
	accepted                time.Time // when the first leg's agent accepted
	first                   time.Time // the attempt's first token
	last                    time.Time // its last token
	gapSum                  time.Duration
	gaps                    int
}

// decided takes in slo's decision for the attempt: the prediction to
// score, a decision by capacity counted by its reason, and a probe.
func (c *Call) decided(d *dispatch.Decision) {
	c.tm.predicted, c.tm.predictedITL = d.Prediction.TTFT, d.Prediction.ITL
	if d.Fallback != "" {
		c.b.fallbackCounter(c.Model, d.Fallback).Inc()
	}
	if d.Probe {
		c.b.probed(c.Model, d.Route, c.b.now())
	}
}

// need returns what the current attempt requires of its route: the
// request's targets (the broker's defaults where it sets none), its
// prompt length and a view of the prefix caches. It computes the
// prompt's block keys, which prefer then reuses.
func (c *Call) need(m *dispatch.Model) dispatch.Need {
	n := dispatch.Need{NoPD: c.req.NoPD, Reason: c.req.NoPDReason, Targets: c.targets()}
	c.abandonPrefill()
	c.tm = callTiming{model: m}
	mode := m.Mode()
	n.Guard = mode == dispatch.ModeSLO && c.b.guarded(c.Model)
	n.NoProbe = mode == dispatch.ModeSLO && c.b.probeHeld(c.Model, c.b.now())
	if c.req.API == wire.API_API_EMBEDDINGS ||
		(c.b.cfg.Affinity.Mode == AffinityOff && mode != dispatch.ModeSLO && mode != dispatch.ModeThreshold) {
		return n
	}
	a := &c.aff
	if len(a.body) != len(c.body) || (len(c.body) > 0 && &a.body[0] != &c.body[0]) {
		a.keys = c.promptKeys(a.keys[:0])
		a.body = c.body
	}
	if len(a.keys) > 0 {
		// Only whole blocks have keys: the partial last one counts half.
		bs := c.blockSize()
		c.tm.tokens = len(a.keys)*bs + bs/2
		n.PromptTokens = c.tm.tokens
		n.Cache = (*promptCache)(c)
	}
	return n
}

// targets are the request's targets, field by field the broker's
// defaults where it sets none.
func (c *Call) targets() Targets {
	t := c.req.Targets
	if t.TTFT <= 0 {
		t.TTFT = c.b.cfg.Targets.TTFT
	}
	if t.ITL <= 0 {
		t.ITL = c.b.cfg.Targets.ITL
	}
	return t
}

func (c *Call) blockSize() int {
	if bs := c.b.cfg.Affinity.BlockSize; bs > 0 {
		return bs
	}
	return affinity.DefaultBlockSize
}

// promptCache answers dispatch.PrefixCache for a call's current attempt
// from the broker's prefix-affinity trees: a pointer to the call, so
// passing it in a Need allocates nothing.
type promptCache Call

var _ dispatch.PrefixCache = (*promptCache)(nil)

// Cached returns the longest cached prefix, in tokens, that an agent of
// pool (of pairing pair, for prefill) holds by the broker's tree.
func (p *promptCache) Cached(pool dispatch.Pool, pair string) int {
	c := (*Call)(p)
	if pool == dispatch.PoolDecode {
		return 0
	}
	return c.cachedOn(pool, pair, "")
}

// cachedOn returns the longest prefix of the current prompt, in tokens,
// the affinity tree of pool knows an agent to hold: agent itself when
// set, else any agent of pairing pair ("": any).
func (c *Call) cachedOn(pool dispatch.Pool, pair, agent string) int {
	v, ok := c.b.aff.pools.Load(poolKey{c.Model, pool.String()})
	if !ok || len(c.aff.keys) == 0 {
		return 0
	}
	var mbuf [16]affinity.Match
	best := 0
	for _, mt := range v.(*poolAffinity).tree.Match(c.aff.keys, mbuf[:0]) {
		switch {
		case agent != "" && mt.Agent != agent:
			continue
		case agent == "" && pair != "" && !c.tm.inPair(mt.Agent, pair):
			continue
		}
		best = max(best, mt.Blocks)
	}
	return min(best*c.blockSize(), c.tm.tokens)
}

func (t *callTiming) inPair(agent, pair string) bool {
	if t.model == nil {
		return false
	}
	for _, v := range t.model.AgentsView() {
		if v.ID == agent {
			return v.Pair == pair
		}
	}
	return false
}

// timeAccepted learns from an accepted chunk: the first leg's queue wait
// (publish to accept); the attempt enters its agent's prefill.
func (c *Call) timeAccepted(ch *wire.Chunk) {
	prefill := ch.GetStage() == wire.Chunk_STAGE_PREFILL
	if (c.Route == dispatch.RoutePD) != prefill || c.attemptStart.IsZero() {
		return // a decode leg's accept: its wait is in its TTFT
	}
	now := c.b.now()
	c.tm.accepted = now
	id := ch.GetAgentId()
	c.abandonPrefill()
	c.tm.prefilling = strings.Clone(id)
	wait := now.Sub(c.attemptStart).Seconds()
	c.b.timing.observe(c.Model, id, now, false, func(a *agentTiming) {
		a.wait.add(wait)
		a.prefillBegan(now)
	})
}

// endPrefill ends the attempt's prefill on its first leg's agent at now
// and keeps its share of the agent's busy time.
func (c *Call) endPrefill(now time.Time) {
	t := &c.tm
	if t.prefilling == "" {
		return
	}
	id := t.prefilling
	t.prefilling = ""
	c.b.timing.observe(c.Model, id, now, false, func(a *agentTiming) { t.prefillSecs = a.prefillEnded(now) })
}

// abandonPrefill takes an attempt that ends without a first token out of
// its agent's prefill count.
func (c *Call) abandonPrefill() {
	t := &c.tm
	if t.prefilling == "" {
		return
	}
	id := t.prefilling
	t.prefilling = ""
	now := c.b.now()
	c.b.timing.observe(c.Model, id, now, false, func(a *agentTiming) { a.prefillAbandoned(now) })
}

// learnPrefill teaches agent id's prefill rate from the engine's usage
// chunk raw (its JSON, as relayed): the prompt tokens it prefilled, over
// the attempt's share of its busy time. An engine whose usage says
// nothing of cached prompt tokens teaches no rate: the agent is marked
// unreported until one does.
func (c *Call) learnPrefill(id string, raw []byte) {
	secs := c.tm.prefillSecs
	c.tm.prefillSecs = 0
	if id == "" || !(secs > 0) {
		return
	}
	toks, ok := oaiformat.PrefilledTokens(raw)
	now := c.b.now()
	c.b.timing.observe(c.Model, id, now, false, func(a *agentTiming) {
		a.unreported = !ok
		if !ok {
			return
		}
		a.reqToks.add(float64(toks))
		a.accToks += float64(toks)
		a.accSecs += secs
		if a.prefillSecs.set && a.accSecs < prefillWindow {
			return
		}
		if a.accToks > 0 {
			a.prefillToks.add(a.accToks)
			a.prefillSecs.add(a.accSecs)
		}
		a.accToks, a.accSecs = 0, 0
	})
}

// timeHandOff learns from a prefill leg's hand-off: the prefill agent's
// TTFT (publish to hand-off) and its prefill rate.
// raw is the prefill engine's usage as its agent relayed it, if any.
func (c *Call) timeHandOff(raw []byte) {
	if c.tm.accepted.IsZero() {
		return
	}
	ttft := c.handedOff.Sub(c.attemptStart).Seconds()
	c.endPrefill(c.handedOff)
	c.b.timing.observe(c.Model, c.prefillAgent, c.handedOff, true, func(a *agentTiming) { a.ttft.add(ttft) })
	c.learnPrefill(c.prefillAgent, raw)
}

// timeToken learns from a token chunk of events events that arrived at
// now: the first token's TTFT (a regular agent's from the publish, with
// its prefill rate; a decode agent's from the hand-off), then the gaps
// between tokens, a gap spread over the events it brought.
func (c *Call) timeToken(now time.Time, events int) {
	t := &c.tm
	if t.first.IsZero() {
		t.first, t.last = now, now
		if t.predicted > 0 && !c.attemptStart.IsZero() {
			c.b.scorePrediction(c.Model, c.Route, t.predicted, now.Sub(c.attemptStart))
		}
		switch {
		case c.Route == dispatch.RouteRegular && !t.accepted.IsZero():
			ttft := now.Sub(c.attemptStart).Seconds()
			c.endPrefill(now)
			c.b.timing.observe(c.Model, c.agent, now, true, func(a *agentTiming) { a.ttft.add(ttft) })
		case c.Route == dispatch.RoutePD && !c.handedOff.IsZero():
			ttft := now.Sub(c.handedOff).Seconds()
			c.b.timing.observe(c.Model, c.agent, now, true, func(a *agentTiming) { a.ttft.add(ttft) })
		}
		return
	}
	t.gapSum += now.Sub(t.last)
	t.gaps += max(events, 1)
	t.last = now
	if t.gaps >= itlFoldEvery {
		c.foldGaps(now)
	}
}

// foldGaps adds the mean of the gaps summed since the last fold to the
// speaking agent's inter-token latency.
func (c *Call) foldGaps(now time.Time) {
	t := &c.tm
	if t.gaps == 0 {
		return
	}
	mean := t.gapSum.Seconds() / float64(t.gaps)
	t.gapSum, t.gaps = 0, 0
	c.b.timing.observe(c.Model, c.agent, now, false, func(a *agentTiming) { a.itl.add(mean) })
}

// timeFinal learns from the final chunk of a regular attempt: the
// prompt tokens its engine prefilled, from the usage it reported.
func (c *Call) timeFinal(ch *wire.Chunk) {
	if c.Route == dispatch.RouteRegular && ch.GetStage() == wire.Chunk_STAGE_MAIN {
		c.learnPrefill(c.agent, ch.GetRaw())
	}
}

// timeDone folds the stream's last gaps, learns the output length of a
// request that ended well, and counts one with targets as meeting them or
// not: its TTFT (submission to first token) and its mean time per output
// token after the first.
func (c *Call) timeDone(outcome string) {
	now := c.b.now()
	c.abandonPrefill()
	c.foldGaps(now)
	if outcome == OutcomeOK && c.tokens > 0 {
		n := float64(c.tokens)
		c.b.timing.observe(c.Model, c.agent, now, false, func(a *agentTiming) { a.output.add(n) })
	}
	if outcome == OutcomeOK && c.tm.predictedITL > 0 && !c.tm.first.IsZero() && c.tokens > 1 && c.lastToken.After(c.tm.first) {
		// The attempt's own tokens: a retried call's earlier ones ran elsewhere.
		c.b.scoreITLPrediction(c.Model, c.Route, c.tm.predictedITL, c.lastToken.Sub(c.tm.first)/time.Duration(c.tokens-1))
	}
	t := c.targets()
	if outcome != OutcomeOK || (t.TTFT <= 0 && t.ITL <= 0) || c.firstToken.IsZero() {
		return
	}
	met := t.TTFT <= 0 || c.firstToken.Sub(c.Started) <= t.TTFT
	if t.ITL > 0 && c.tokens > 1 {
		met = met && c.lastToken.Sub(c.firstToken)/time.Duration(c.tokens-1) <= t.ITL
	}
	c.b.attain(c.Model, c.Route).count(met)
}

func (a *attainment) count(met bool) {
	i := 1
	if met {
		i = 0
	}
	a.counts[i].Add(1)
	a.counters[i].Inc()
}

// attain returns the attainment counts of model and route.
func (b *Broker) attain(model string, route dispatch.Route) *attainment {
	k := obsKey{model, route}
	if v, ok := b.timing.attainment.Load(k); ok {
		return v.(*attainment)
	}
	a := &attainment{}
	r := route.String()
	a.counters[0] = b.metrics.slo.WithLabelValues(model, r, "met")
	a.counters[1] = b.metrics.slo.WithLabelValues(model, r, "missed")
	v, _ := b.timing.attainment.LoadOrStore(k, a)
	return v.(*attainment)
}

// Attainment is how many requests with latency targets, of one route,
// met them or missed them since the broker started.
type Attainment struct {
	Met    uint64 `json:"met"`
	Missed uint64 `json:"missed"`
}

// SLOAttainment returns model's attainment on route.
func (b *Broker) SLOAttainment(model string, route dispatch.Route) Attainment {
	v, ok := b.timing.attainment.Load(obsKey{model, route})
	if !ok {
		return Attainment{}
	}
	a := v.(*attainment)
	return Attainment{Met: a.counts[0].Load(), Missed: a.counts[1].Load()}
}

// PoolTiming is what the broker learned of one pool's latency: the mean
// of the figures of its agents that have any (see dispatch.Timing).
type PoolTiming struct {
	Pool        dispatch.Pool
	Agents      int // agents with figures
	Samples     int
	TTFT        time.Duration
	ITL         time.Duration
	QueueWait   time.Duration
	PrefillRate float64 // prompt tokens per second
	// OutputTokens is the mean of tokens streamed per request.
	OutputTokens float64
	// CacheUnreported counts the agents whose engines' answers report no
	// cached prompt tokens: no prefill rate is learned of them.
	CacheUnreported int
}

// PoolTimings returns the learned figures of m's pools, regular, prefill
// and decode, as m's snapshot holds them.
func PoolTimings(m *dispatch.Model) [3]PoolTiming {
	var out [3]PoolTiming
	var rates, outs [3]int
	for _, v := range m.Agents() {
		t := &v.Timing
		if t.Samples <= 0 || int(v.Pool) >= len(out) {
			continue
		}
		p := &out[v.Pool]
		p.Agents++
		p.Samples += t.Samples
		p.TTFT += t.TTFT
		p.ITL += t.ITL
		p.QueueWait += t.QueueWait
		if t.CacheUnreported {
			p.CacheUnreported++
		}
		if t.PrefillRate > 0 {
			p.PrefillRate += t.PrefillRate
			rates[v.Pool]++
		}
		if t.OutputTokens > 0 {
			p.OutputTokens += t.OutputTokens
			outs[v.Pool]++
		}
	}
	for i := range out {
		p := &out[i]
		p.Pool = dispatch.Pool(i)
		if p.Agents > 0 {
			n := time.Duration(p.Agents)
			p.TTFT, p.ITL, p.QueueWait = p.TTFT/n, p.ITL/n, p.QueueWait/n
		}
		if rates[i] > 0 {
			p.PrefillRate /= float64(rates[i])
		}
		if outs[i] > 0 {
			p.OutputTokens /= float64(outs[i])
		}
	}
	return out
}
