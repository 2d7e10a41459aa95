package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// Prefix-cache affinity (docs/affinity.md). After dispatch.Decide
// chose the route, the broker looks up which agent of the route's first
// pool (regular, or PD's prefill) holds the longest prefix of the prompt
// and, if affinity.Choose lets it, offers the job on that agent's directed
// queue instead of the pool's shared one. The call's reader watches the
// offer: not taken within AffinityConfig.Wait, the job is deleted from the
// directed queue (a failed delete means the agent took it) and published,
// same attempt, to the shared queue. So a busy, draining or dead agent
// never strands a job, and agents still only pull what they can hold.

// AffinityMode says where the broker learns which agent caches a prefix.
type AffinityMode uint8

const (
	// AffinityDefault takes DefaultAffinity.
	AffinityDefault AffinityMode = iota
	// AffinityOff is pure pull: every job goes to its pool's shared queue.
	AffinityOff
	// AffinityApprox remembers which agent took which prompt (this
	// broker's and its peers' requests).
	AffinityApprox
	// AffinityPrecise also applies the KV events agents forward from
	// their engines; agents without events stay approximate.
	AffinityPrecise
)

// DefaultAffinity is the mode of a Config that names none; see
// docs/performance.md for the measurement that chose it.
const DefaultAffinity = AffinityPrecise

// DefaultAffinityWait is how long a directed job waits for its agent
// before it moves to the shared queue: long enough for a full agent's slot
// to free up for a short turn, so an offer queued behind it is usually
// taken, and short enough that a dead or draining agent costs a turn
// little (docs/performance.md, "Prefix-cache affinity").
const DefaultAffinityWait = 300 * time.Millisecond

// DefaultAffinityGuard is the broker's guard: affinity.DefaultGuard (the
// reference gateway's thresholds) with an absolute balance of 3 requests,
// since with DefaultAffinityQueue offers waiting, a preferred agent's load
// counts them too.
func DefaultAffinityGuard() affinity.Guard {
	g := affinity.DefaultGuard()
	g.BalanceAbs = 3
	return g
}

var affinityModes = [...]string{AffinityDefault: "default", AffinityOff: "off", AffinityApprox: "approx", AffinityPrecise: "precise"}

func (m AffinityMode) String() string {
	if int(m) < len(affinityModes) {
		return affinityModes[m]
	}
	return fmt.Sprintf("AffinityMode(%d)", uint8(m))
}

// ParseAffinityMode parses "off", "approx" or "precise".
func ParseAffinityMode(s string) (AffinityMode, error) {
	for i, n := range affinityModes {
		if i != int(AffinityDefault) && n == s {
			return AffinityMode(i), nil
		}
	}
	return 0, fmt.Errorf("affinity %q: want off, approx or precise", s)
}

// AffinityConfig configures prefix-cache affinity.
type AffinityConfig struct {
	Mode AffinityMode
	// Wait bounds how long a job offered to one agent waits for it before
	// it moves to the shared queue (default DefaultAffinityWait).
	Wait time.Duration
	// Guard bounds when the cache outweighs the load (zero: the defaults).
	Guard affinity.Guard
	// BlockSize is the pieces per block key; it must match the engines'
	// block size for their KV events to name the same keys (default 16).
	BlockSize int
	// MaxBlocks bounds each (model, pool) tree (default
	// affinity.DefaultMaxBlocks).
	MaxBlocks int
	// Queue is how many offers beyond its free effective slots an agent
	// may have waiting in its directed queue: a job that would find its
	// prefix there waits up to Wait for a slot of that agent rather than
	// prefill the prompt again elsewhere. The agent still pulls only
	// within its slots. Zero takes DefaultAffinityQueue; a negative value
	// prefers only agents with a free slot (the guard's plain rule).
	Queue int
}

// DefaultAffinityQueue is AffinityConfig.Queue's default: a few offers may
// wait for the agent that caches their prefix, because preferring only
// agents with a free slot sends a busy fleet's turns elsewhere to prefill
// their conversation again (docs/performance.md, "Prefix-cache affinity").
const DefaultAffinityQueue = 3

func (c *AffinityConfig) setDefaults() {
	if c.Mode == AffinityDefault {
		c.Mode = DefaultAffinity
	}
	if c.Wait == 0 {
		c.Wait = DefaultAffinityWait
	}
	if c.Guard == (affinity.Guard{}) {
		c.Guard = DefaultAffinityGuard()
	}
	if c.BlockSize == 0 {
		c.BlockSize = affinity.DefaultBlockSize
	}
	switch {
	case c.Queue == 0:
		c.Queue = DefaultAffinityQueue
	case c.Queue < 0:
		c.Queue = 0
	}
}

// Validate reports a bad knob after defaults.
func (c AffinityConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Mode > AffinityPrecise {
		errs = append(errs, fmt.Errorf("affinity mode %d", c.Mode))
	}
	if c.Wait < 0 {
		errs = append(errs, errors.New("affinity wait must not be negative"))
	}
	if c.BlockSize < 1 || c.MaxBlocks < 0 {
		errs = append(errs, errors.New("affinity block size must be positive, max blocks not negative"))
	}
	if err := c.Guard.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Fallback reasons: why a dispatch in affinity mode went to the shared
// queue, and NotTakenInTime for an offer that moved there.
const (
	AffinityHit            = "affinity"
	FallbackNoMatch        = "no_match"
	FallbackFull           = "full"
	FallbackImbalanced     = "imbalanced"
	FallbackNotTakenInTime = "not_taken_in_time"
	// FallbackDirectedUnusable counts offers sent to the shared queue
	// because the directed stream was unusable (directed.go).
	FallbackDirectedUnusable = "directed_unusable"
)

const (
	resAffinity = iota
	resNoMatch
	resFull
	resImbalanced
	resNotTaken
	resUnusable
	numResults
)

var resultNames = [numResults]string{AffinityHit, FallbackNoMatch, FallbackFull, FallbackImbalanced, FallbackNotTakenInTime, FallbackDirectedUnusable}

func resultOf(r affinity.Reason) int {
	switch r {
	case affinity.Affinity:
		return resAffinity
	case affinity.Full:
		return resFull
	case affinity.Imbalanced:
		return resImbalanced
	}
	return resNoMatch
}

// affinityState is the broker's prefix knowledge and its counters.
type affinityState struct {
	pools    sync.Map // poolKey -> *poolAffinity
	loads    sync.Map // agentKey -> *agentLoad
	lastPeer atomic.Int64
}

type poolKey struct{ model, pool string }

// poolAffinity is one (model, pool)'s tree and counters.
type poolAffinity struct {
	model, pool string
	tree        *affinity.Tree
	learnSubj   string
	results     [numResults]atomic.Uint64
	counters    [numResults]prometheus.Counter // the affinity metric's series of this pool
}

// count counts one affinity result of this pool, in its stats and its
// metric.
func (p *poolAffinity) count(r int) {
	p.results[r].Add(1)
	p.counters[r].Inc()
}

// agentLoad is what this broker knows of one agent between heartbeats:
// jobs offered to it and not yet taken or moved, and jobs it took and
// still holds.
type agentLoad struct{ offered, held atomic.Int64 }

func (b *Broker) affPool(model, pool string) *poolAffinity {
	k := poolKey{model, pool}
	if v, ok := b.aff.pools.Load(k); ok {
		return v.(*poolAffinity)
	}
	p := &poolAffinity{model: model, pool: pool, tree: affinity.NewTree(affinity.TreeConfig{MaxBlocks: b.cfg.Affinity.MaxBlocks, Blend: true})}
	p.learnSubj, _ = b.subj.Learn(model, pool, b.cfg.ID)
	// The metric's series are looked up once per pool, not per request.
	for r, name := range resultNames {
		p.counters[r] = b.metrics.affinity.WithLabelValues(model, pool, name)
	}
	v, _ := b.aff.pools.LoadOrStore(k, p)
	return v.(*poolAffinity)
}

func (b *Broker) agentLoad(model, id string) *agentLoad {
	k := agentKey{model, id}
	if v, ok := b.aff.loads.Load(k); ok {
		return v.(*agentLoad)
	}
	v, _ := b.aff.loads.LoadOrStore(k, new(agentLoad))
	return v.(*agentLoad)
}

// callAffinity is one call's affinity state, owned by its reader.
type callAffinity struct {
	pool  *poolAffinity
	keys  []uint64
	body  []byte // the body keys were computed from
	agent string // the agent the pending offer goes to ("" none)
	// The offer in the stream: its sequence, the shared subject it moves
	// to and the job's bytes.
	seq    uint64
	shared string
	data   []byte
	timer  *time.Timer
	move   <-chan time.Time
	// directed: the current attempt's job (c.jobSeq) is in the directed
	// stream, not the jobs stream.
	directed bool
	at       time.Time // when the offer was published
	// moved: the offer was moved to the shared queue (at c.jobSeq).
	moved bool
	// learnt is the agent the current attempt's keys were inserted for
	// at its accept, and insert that Insert's number (see forget).
	learnt string
	insert uint32
}

// promptKeys appends the block keys of the current body's prompt to dst:
// from what the ingress decoded when the body is the client's, else (a
// continuation's body) decoded again.
func (c *Call) promptKeys(dst []uint64) []uint64 {
	bs := c.b.cfg.Affinity.BlockSize
	if f := c.req.Format; f != nil && len(c.body) == len(c.req.Body) && (len(c.body) == 0 || &c.body[0] == &c.req.Body[0]) {
		if p, ok := f.Prompt(); ok {
			return p.AppendKeys(dst, bs)
		}
		return dst
	}
	return oaiformat.PromptKeys(dst, bs, c.req.API, c.body)
}

// prefer returns the subject to publish the current attempt's job on:
// the directed queue of the agent affinity prefers, or shared. It runs
// after dispatch.Decide; pool and pair are the route's first queue.
func (c *Call) prefer(m *dispatch.Model, pool, pair, shared string) string {
	b := c.b
	a := &c.aff
	a.agent, a.pool, a.moved, a.directed = "", nil, false, false
	if b.cfg.Affinity.Mode == AffinityOff || (pool != subjects.PoolRegular && pool != subjects.PoolPrefill) ||
		c.req.API == wire.API_API_EMBEDDINGS {
		return shared
	}
	if len(a.body) != len(c.body) || (len(c.body) > 0 && &a.body[0] != &c.body[0]) {
		a.keys = c.promptKeys(a.keys[:0])
		a.body = c.body
	}
	p := b.affPool(c.Model, pool)
	a.pool = p
	if len(a.keys) == 0 {
		p.count(resNoMatch)
		return shared
	}
	var mbuf [16]affinity.Match
	matches := p.tree.Match(a.keys, mbuf[:0])
	var cbuf [16]affinity.Candidate
	cands := cbuf[:0]
	solo := time.Since(time.Unix(0, b.aff.lastPeer.Load())) > peerWindow
	wantPool, _ := dispatch.ParsePool(pool)
	for _, v := range m.AgentsView() {
		if v.Pool != wantPool || v.Pair != pair || c.ranBefore(v.ID) {
			continue // an agent an earlier attempt of the call left is not offered it again
		}
		l := b.agentLoad(c.Model, v.ID)
		held := int(l.held.Load())
		active := held
		if !solo {
			active = max(v.Active, held)
		}
		load := active + int(l.offered.Load())
		cand := affinity.Candidate{Agent: v.ID, Load: load, FreeSlots: int(math.Floor(v.EffectiveSlots)) + b.cfg.Affinity.Queue - load}
		switch {
		case v.Eligible:
			cand.State = affinity.Ready
		case v.Reason == dispatch.ReasonStale:
			cand.State = affinity.Stale
		case v.Reason == dispatch.ReasonDraining:
			cand.State = affinity.Draining
		default:
			cand.State = affinity.Warming
		}
		for _, mt := range matches {
			if mt.Agent == v.ID {
				cand.Matched, cand.Precise = mt.Blocks, mt.Precise
				break
			}
		}
		cands = append(cands, cand)
	}
	d := affinity.Choose(cands, b.cfg.Affinity.Guard)
	r := resultOf(d.Reason)
	p.count(r)
	if d.Index < 0 {
		return shared
	}
	if !b.directed.usable.Load() {
		p.count(resUnusable)
		return shared
	}
	to, err := b.subj.Directed(c.Model, pool, pair, cands[d.Index].Agent)
	if err != nil {
		return shared
	}
	a.agent, a.shared = cands[d.Index].Agent, shared
	return to
}

// peerWindow is how long after the last message of another broker this
// one counts agents' load from heartbeats too: alone, its own count of the
// jobs they hold is exact and fresher.
const peerWindow = 30 * time.Second

// offered records the job just published at seq: an offer to a.agent
// starts its wait for the agent.
func (c *Call) offered(seq uint64, data []byte) {
	a := &c.aff
	a.stopTimer()
	if a.agent == "" {
		return
	}
	a.seq, a.data, a.moved, a.at = seq, data, false, time.Now()
	c.load.offer(c.b.agentLoad(c.Model, a.agent))
	a.arm(c.b.cfg.Affinity.Wait)
}

func (a *callAffinity) arm(d time.Duration) {
	if a.timer == nil {
		a.timer = time.NewTimer(d)
	} else {
		a.timer.Reset(d)
	}
	a.move = a.timer.C
}

func (a *callAffinity) stopTimer() {
	if a.timer != nil {
		a.timer.Stop()
	}
	// Not written when nil: the reply goroutine stops no timer (see
	// Call.acceptOK) while the waiting reader's select reads move.
	if a.move != nil {
		a.move = nil
	}
}

// accepted is called when an agent accepts the current attempt (stage
// prefill for PD): the offer is settled, the agent counted as holding the
// job, and the prompt's keys inserted for it and shared with the peers.
func (c *Call) accepted(agentID string, prefill bool) {
	a := &c.aff
	if (c.Route == dispatch.RoutePD) != prefill {
		if !prefill {
			c.load.releaseAgent() // PD: the prefill leg is over once decode took it
		}
		return
	}
	a.stopTimer()
	c.load.settleOffer()
	if a.moved && agentID == a.agent {
		// The offered agent took its directed copy after all, just as the
		// broker moved it: the shared copy is deleted before another agent
		// runs it too (if one took it already, it is stopped when it
		// speaks, see onChunk).
		a.moved = false
		c.b.deleteJob(c.jobSeq)
	}
	if a.pool == nil {
		return
	}
	c.load.holdAgent(c.b.agentLoad(c.Model, agentID))
	if len(a.keys) == 0 {
		return
	}
	a.learnt, a.insert = agentID, a.pool.tree.Insert(agentID, a.keys)
	if a.pool.learnSubj != "" && c.b.peersListen(a.pool.learnSubj) {
		_ = c.b.nc.Publish(a.pool.learnSubj, encodeLearn(agentID, a.keys))
	}
}

// forget undoes what the current attempt taught this broker's tree when
// the attempt failed before its engine can have cached the prompt: before
// the first token, and for PD before the prefill leg handed off. Blocks
// another request sent to that agent stay (affinity.Tree.Forget). Peers
// that learnt the keys from this broker keep them until they evict them
// or the agent leaves: a guess that costs an offer at most the wait.
func (c *Call) forget() {
	a := &c.aff
	agent, insert := a.learnt, a.insert
	a.learnt, a.insert = "", 0
	if agent == "" || a.pool == nil || !c.firstToken.IsZero() || !c.handedOff.IsZero() {
		return
	}
	a.pool.tree.Forget(agent, a.keys, insert)
}

// moveOffer runs when a directed job's wait is over: if no agent took it,
// it moves to the shared queue, same attempt. An error is the publish's;
// the reader then recovers the attempt like any other failure.
func (c *Call) moveOffer(ctx context.Context) error {
	a := &c.aff
	a.move = nil
	if c.load.offered == nil || c.jobSeq != a.seq || c.agent != "" || c.prefillAgent != "" {
		c.load.settleOffer()
		return nil
	}
	if c.Buffered() > 0 {
		// An accepted chunk may be waiting to be read: read it first.
		a.arm(time.Millisecond)
		return nil
	}
	err := errNoDirected
	if st := c.b.directed.st.Load(); st != nil {
		dctx, cancel := context.WithTimeout(ctx, c.b.publishTimeout)
		err = (*st).DeleteMsg(dctx, a.seq)
		if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) && c.b.offerTaken(dctx, *st, a.seq, a.at) {
			cancel()
			return nil // taken: its accepted chunk is on the way
		}
		cancel()
	}
	if err != nil {
		// The directed stream does not answer (its one server lost) or
		// refuses: the offer cannot be taken from it now, so it moves like
		// one not taken; if its agent took it after all, accepted deletes
		// the shared copy.
		c.b.directedFailed(err)
	}
	a.directed = false
	c.load.settleOffer()
	c.jobSeq = 0
	a.pool.count(resNotTaken)
	pctx, cancel := context.WithTimeout(ctx, c.b.publishTimeout)
	defer cancel()
	ack, err := c.b.js.Publish(pctx, a.shared, a.data)
	if err != nil {
		return publishError(a.shared, err)
	}
	c.jobSeq, a.moved = ack.Sequence, true
	return nil
}

// encodeLearn is a learn message: the agent id's length (one byte), the
// id, then the keys, 8 bytes each, little endian.
func encodeLearn(agentID string, keys []uint64) []byte {
	out := make([]byte, 0, 1+len(agentID)+8*len(keys))
	out = append(out, byte(len(agentID)))
	out = append(out, agentID...)
	for _, k := range keys {
		out = binary.LittleEndian.AppendUint64(out, k)
	}
	return out
}

func decodeLearn(data []byte) (string, []uint64, bool) {
	if len(data) < 1 || len(data) < 1+int(data[0]) || (len(data)-1-int(data[0]))%8 != 0 {
		return "", nil, false
	}
	n := int(data[0])
	id := string(data[1 : 1+n])
	rest := data[1+n:]
	keys := make([]uint64, len(rest)/8)
	for i := range keys {
		keys[i] = binary.LittleEndian.Uint64(rest[8*i:])
	}
	return id, keys, id != ""
}

// startAffinity subscribes to the peers' learn messages and, in precise
// mode, to the agents' KV events; the returned func unsubscribes.
func (b *Broker) startAffinity() (func(), error) {
	if b.cfg.Affinity.Mode == AffinityOff {
		return func() {}, nil
	}
	var subs []*nats.Subscription
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	s, err := b.nc.Subscribe(b.subj.LearnAll(), b.onLearn)
	if err != nil {
		return stop, fmt.Errorf("broker: subscribe learn: %w", err)
	}
	subs = append(subs, s)
	if b.cfg.Affinity.Mode == AffinityPrecise {
		s, err := b.nc.Subscribe(b.subj.KVAll(), b.onKV)
		if err != nil {
			stop()
			return func() {}, fmt.Errorf("broker: subscribe kv events: %w", err)
		}
		subs = append(subs, s)
	}
	for _, s := range subs {
		_ = s.SetPendingLimits(1<<16, 256<<20)
	}
	return stop, nil
}

// peersListen reports whether a learn message on subject may reach a
// peer: not when the broker's own subscription is the only one its
// account has (one listener), and yes when that cannot be told (no
// LearnListeners, or a count that misses the broker's own).
func (b *Broker) peersListen(subject string) bool {
	if b.cfg.LearnListeners == nil {
		return true
	}
	return b.cfg.LearnListeners(subject) != 1
}

func (b *Broker) onLearn(m *nats.Msg) {
	k, err := b.subj.ParseLearn(m.Subject)
	if err != nil || k.Agent == b.cfg.ID {
		return // our own, inserted at accept
	}
	b.aff.lastPeer.Store(time.Now().UnixNano())
	id, keys, ok := decodeLearn(m.Data)
	if !ok {
		return
	}
	b.affPool(k.Model, k.Pool).tree.Insert(id, keys)
}

func (b *Broker) onKV(m *nats.Msg) {
	k, err := b.subj.ParseKV(m.Subject)
	if err != nil {
		return
	}
	f, err := kvevents.UnmarshalForward(m.Data)
	if err != nil {
		return
	}
	t := b.affPool(k.Model, k.Pool).tree
	if f.Resync {
		t.ForgetPrecise(k.Agent)
	}
	if f.Cleared {
		t.Cleared(k.Agent)
	}
	if len(f.Removed) > 0 {
		t.Removed(k.Agent, f.Removed)
	}
	if len(f.Stored) > 0 {
		t.Stored(k.Agent, f.Stored)
	}
}

// pruneAffinity forgets, in every tree, the agents that drain, warm up
// again (an engine restarted with an empty cache), left the table, or
// stayed stale for staleForget: their caches are gone or not worth
// waiting for. A stale agent is never preferred meanwhile (Choose), but a
// moment's silence (a starved machine, a NATS blip) does not wipe what
// the broker knows of its cache. It runs after each rebuild.
func (b *Broker) pruneAffinity(f *dispatch.Fleet) {
	if b.cfg.Affinity.Mode == AffinityOff {
		return
	}
	now := b.now()
	b.aff.pools.Range(func(_, v any) bool {
		p := v.(*poolAffinity)
		m, _ := f.Model(p.model)
		for _, id := range p.tree.Agents() {
			if !keepInTree(m.AgentsView(), id, now) {
				p.tree.RemoveAgent(id)
			}
		}
		return true
	})
}

// staleForget is how long a silent agent keeps its place in the trees.
const staleForget = 30 * time.Second

func keepInTree(agents []dispatch.AgentView, id string, now time.Time) bool {
	for i := range agents {
		if v := &agents[i]; v.ID == id {
			return v.Eligible || (v.Reason == dispatch.ReasonStale && now.Sub(v.LastSeen) < staleForget)
		}
	}
	return false
}

// AffinityStats is one pool's affinity as the fleet view shows it.
type AffinityStats struct {
	Mode string `json:"mode"`
	// Dispatched counts the dispatches that asked affinity; Affinity those
	// it sent to a preferred agent, and Share is Affinity/Dispatched.
	Dispatched uint64            `json:"dispatched"`
	Affinity   uint64            `json:"affinity"`
	Share      float64           `json:"share"`
	Fallbacks  map[string]uint64 `json:"fallbacks"`
	// Blocks is the tree's (block, agent) entries.
	Blocks int `json:"blocks"`
	// EngineHitRate is hits/queries of the pool's engines' prefix caches
	// as their agents report them; absent when none does.
	EngineHitRate *float64 `json:"engine_hit_rate,omitempty"`
	PreciseAgents int      `json:"precise_agents"`
}

// Affinity returns model's pool's affinity stats.
func (b *Broker) Affinity(model, pool string) AffinityStats {
	s := AffinityStats{Mode: b.cfg.Affinity.Mode.String(), Fallbacks: map[string]uint64{}}
	if v, ok := b.aff.pools.Load(poolKey{model, pool}); ok {
		p := v.(*poolAffinity)
		var r [numResults]uint64
		for i := range r {
			r[i] = p.results[i].Load()
		}
		s.Dispatched = r[resAffinity] + r[resNoMatch] + r[resFull] + r[resImbalanced] // resUnusable is within these
		s.Affinity = r[resAffinity]
		for i := resNoMatch; i < numResults; i++ {
			s.Fallbacks[resultNames[i]] = r[i]
		}
		if s.Dispatched > 0 {
			s.Share = float64(s.Affinity) / float64(s.Dispatched)
		}
		s.Blocks = p.tree.Stats().Blocks
	}
	var q, h float64
	known := false
	for _, hb := range b.Heartbeats() {
		if hb.GetModel() != model || hb.GetPool() != pool {
			continue
		}
		if hb.GetKvEvents() {
			s.PreciseAgents++
		}
		if hb.PrefixCacheQueries != nil {
			q += hb.GetPrefixCacheQueries()
			h += hb.GetPrefixCacheHits()
			known = true
		}
	}
	if known && q > 0 {
		r := h / q
		s.EngineHitRate = &r
	}
	return s
}

// affinityPools lists the (model, pool) pairs with affinity state.
func (b *Broker) affinityPools() []poolKey {
	var out []poolKey
	b.aff.pools.Range(func(k, _ any) bool {
		out = append(out, k.(poolKey))
		return true
	})
	return out
}

// ranBefore reports whether agent ran an earlier attempt of the call, the
// one being left included (dispatch moves it to ranOn after the offer).
func (c *Call) ranBefore(agent string) bool {
	return agent == c.agent || agent == c.prefillAgent || slices.Contains(c.ranOn, agent)
}
