package affinity

import (
	"math/bits"
	"sync"
)

// Source tells where the tree learnt that an agent holds a block.
type Source uint8

const (
	// Approximate: the broker sent the agent a request with this prefix.
	Approximate Source = 1 << iota
	// Precise: the agent's engine reported that it stored the block.
	Precise
)

const (
	// DefaultMaxBlocks bounds the (block, agent) entries a tree holds, and
	// so its memory, which is linear in the entries and the distinct keys:
	// a tree never grows past it, whatever the prompts.
	DefaultMaxBlocks = 1 << 18
	// MaxAgents is how many agents one tree tracks; the agents beyond it
	// (a pool of more than 256 engines for one model) are never matched.
	MaxAgents = 64 * maxWords
	maxWords  = 4
)

// TreeConfig sizes a [Tree].
type TreeConfig struct {
	// MaxBlocks bounds the (block, agent) entries held; past it the least
	// recently used entry is evicted. Default [DefaultMaxBlocks].
	MaxBlocks int
	// Blend counts, for an agent that reports events, its approximate
	// entries too, and lets its engine's evictions and clears drop both
	// sources: what the broker just sent it (whose blocks the engine
	// stores only once its prefill ran) counts at once, and what the
	// engine evicted stops counting. Without it a precise agent's match
	// is its engine's word alone.
	Blend bool
}

// Tree remembers, for one model and pool, which agents hold which prompt
// blocks, from two sources: what the broker dispatched (approximate) and
// what engines report storing and evicting (precise). For an agent that
// has reported precise events, [Tree.Match] counts only its precise
// blocks: its engine's word beats the broker's guess.
//
// Each key has a bit mask of the agents holding it, per source, so that a
// match costs one map lookup and a few ANDs per block whatever the number
// of agents sharing a prefix. Memory is bounded by
// [TreeConfig.MaxBlocks] (block, agent) entries with one LRU over all
// entries. A request's blocks are touched leaf first, so that the LRU
// evicts the tail of a prefix before its head and a shorter prefix
// survives. A Tree is safe for concurrent use: Match and Stats take the
// read lock, everything else the write lock (one lock, no order to keep).
type Tree struct {
	mu sync.RWMutex
	// ents indexes the entry of each (key, agent).
	ents map[pair]int32
	// slab holds the entries; slab[0] is the sentinel of the LRU list and
	// 0 is the nil link of every list.
	slab []entry
	free int32 // free entries, chained through lruNext
	n    int   // live entries
	max  int
	// keys maps a key to its node: a count of entries and the masks.
	keys  map[uint64]int32
	nodes []node
	// masks holds 2*words words per node: who holds the key
	// approximately, then precisely.
	masks     []uint64
	words     int
	freeNodes []int32
	// precise marks the agents whose engines report events.
	precise [maxWords]uint64

	agents     []agent
	byName     map[string]int32
	freeAgents []int32
	evicted    uint64
	blend      bool
	// inserts numbers the Insert calls, so that Forget can tell entries
	// no Insert touched since the one it undoes.
	inserts uint32
}

type pair struct {
	key   uint64
	agent int32
}

type entry struct {
	key                  uint64
	lruPrev, lruNext     int32
	agentPrev, agentNext int32
	agent                int32
	node                 int32
	// insert is the number of the Insert that marked the entry
	// approximate, while no other Insert touched it; else 0 (see
	// Tree.Forget). It fits the entry's padding.
	insert uint32
	src    Source
}

type node struct {
	refs int32
}

type agent struct {
	name   string
	head   int32 // first entry of the agent's list
	blocks int
}

// NewTree returns an empty tree.
func NewTree(cfg TreeConfig) *Tree {
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	return &Tree{
		ents:   make(map[pair]int32),
		slab:   make([]entry, 1, min(cfg.MaxBlocks+1, 1024)),
		max:    cfg.MaxBlocks,
		keys:   make(map[uint64]int32),
		words:  1,
		byName: make(map[string]int32),
		blend:  cfg.Blend,
	}
}

// Insert records that agent was sent a request whose prompt has keys. It
// returns a number that identifies this insert to [Tree.Forget].
func (t *Tree) Insert(agentName string, keys []uint64) uint32 {
	if len(keys) == 0 {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.agentID(agentName)
	if a < 0 {
		return 0
	}
	if t.inserts++; t.inserts == 0 {
		t.inserts = 1 // 0 is no insert
	}
	for i := len(keys) - 1; i >= 0; i-- {
		var had Source
		if e, ok := t.ents[pair{keys[i], a}]; ok {
			had = t.slab[e].src
		}
		en := &t.slab[t.set(a, keys[i], Approximate)]
		if had&Approximate == 0 {
			en.insert = t.inserts // this insert's own
		} else {
			en.insert = 0 // sent there by two requests: never forgotten
		}
	}
	return t.inserts
}

// Forget undoes the Insert numbered insert of keys for agent: a request
// that failed on the agent before its engine computed the prompt. It
// drops the approximate marks that insert added and no other Insert
// touched since: blocks another request sent there before or after (a
// shared system prompt, the same conversation) still count, and so does
// what the agent's engine reported. (A count of requests per entry
// would know no more: a request that succeeded never gives its count
// back.) A guess kept too long costs an offer that waits at most the
// affinity wait; one dropped wrongly, a prefill.
func (t *Tree) Forget(agentName string, keys []uint64, insert uint32) {
	if insert == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.byName[agentName]
	if !ok {
		return
	}
	for _, k := range keys {
		if e, ok := t.ents[pair{k, a}]; ok && t.slab[e].insert == insert {
			t.clear(e, Approximate)
		}
	}
}

// Stored records that agent's engine stored the blocks keys (a precise
// event), and makes the agent precise from now on.
func (t *Tree) Stored(agentName string, keys []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.agentID(agentName)
	if a < 0 {
		return
	}
	t.markPrecise(a)
	for i := len(keys) - 1; i >= 0; i-- {
		t.set(a, keys[i], Precise)
	}
}

// Removed records that agent's engine evicted the blocks keys.
func (t *Tree) Removed(agentName string, keys []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.byName[agentName]
	if !ok {
		return
	}
	t.markPrecise(a)
	for _, k := range keys {
		if e, ok := t.ents[pair{k, a}]; ok {
			t.clear(e, t.engineSources())
		}
	}
}

// Cleared records that agent's engine dropped its whole cache (vLLM's
// AllBlocksCleared). The agent stays precise.
func (t *Tree) Cleared(agentName string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.byName[agentName]
	if !ok {
		return
	}
	t.markPrecise(a)
	t.clearAgent(a, t.engineSources())
}

// markPrecise records that agent a reports its engine's events: from now
// on only its precise entries count in Match. Called with mu held.
func (t *Tree) markPrecise(a int32) { t.precise[a/64] |= 1 << (a % 64) }

// engineSources is what an engine's eviction drops.
func (t *Tree) engineSources() Source {
	if t.blend {
		return Precise | Approximate
	}
	return Precise
}

// ForgetPrecise drops what agent's engine reported and makes the agent
// approximate again, for when its event stream is lost (the agent missed
// events or stopped forwarding them).
func (t *Tree) ForgetPrecise(agentName string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.byName[agentName]
	if !ok {
		return
	}
	t.precise[a/64] &^= 1 << (a % 64)
	t.clearAgent(a, Precise)
}

// RemoveAgent forgets agent entirely: it is gone or draining.
func (t *Tree) RemoveAgent(agentName string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.byName[agentName]
	if !ok {
		return
	}
	t.clearAgent(a, Approximate|Precise)
	t.precise[a/64] &^= 1 << (a % 64)
	delete(t.byName, agentName)
	t.agents[a] = agent{}
	t.freeAgents = append(t.freeAgents, a)
}

// Match is how many leading blocks of a prompt an agent holds.
type Match struct {
	Agent string
	// Blocks is the length of the longest prefix of the keys the agent
	// holds, in blocks.
	Blocks int
	// Precise tells that the count comes from the agent's engine events.
	Precise bool
}

// Match appends to dst[:0] one Match per agent holding at least the first
// of keys, and returns it; it does not allocate when dst has room for the
// agents.
func (t *Tree) Match(keys []uint64, dst []Match) []Match {
	dst = dst[:0]
	if len(keys) == 0 {
		return dst
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	var alive [maxWords]uint64
	w := t.words
	n, ok := t.keys[keys[0]]
	if !ok {
		return dst
	}
	depth := 1
	for some := t.held(n, &alive, nil); some && depth < len(keys); depth++ {
		n, ok := t.keys[keys[depth]]
		if !ok {
			break
		}
		var next [maxWords]uint64
		some = t.held(n, &next, &alive)
		for j := range w {
			dst = t.appendAgents(dst, alive[j]&^next[j], j, depth)
		}
		alive = next
	}
	// The agents still alive hold every key up to where the walk stopped.
	for j := range w {
		dst = t.appendAgents(dst, alive[j], j, depth)
	}
	return dst
}

// held sets out to the agents holding node n by the source that counts
// for each, ANDed with in when in is not nil, and reports whether any.
func (t *Tree) held(n int32, out, in *[maxWords]uint64) bool {
	w := t.words
	m := t.masks[int(n)*2*w:]
	var some uint64
	for j := range w {
		h := m[j]&^t.precise[j] | m[w+j]&t.precise[j]
		if t.blend {
			h = m[j] | m[w+j]
		}
		if in != nil {
			h &= in[j]
		}
		out[j] = h
		some |= h
	}
	return some != 0
}

func (t *Tree) appendAgents(dst []Match, mask uint64, word, blocks int) []Match {
	for mask != 0 {
		b := bits.TrailingZeros64(mask)
		mask &^= 1 << b
		a := word*64 + b
		dst = append(dst, Match{Agent: t.agents[a].name, Blocks: blocks, Precise: t.precise[word]&(1<<b) != 0})
	}
	return dst
}

// Stats is a tree's size.
type Stats struct {
	Blocks  int    // live (block, agent) entries
	Keys    int    // distinct keys
	Agents  int    // agents known
	Evicted uint64 // entries evicted by the bound since NewTree
}

// Stats returns the tree's size now.
func (t *Tree) Stats() Stats {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return Stats{Blocks: t.n, Keys: len(t.keys), Agents: len(t.byName), Evicted: t.evicted}
}

// Agents returns the names of the agents the tree knows.
func (t *Tree) Agents() []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]string, 0, len(t.byName))
	for name := range t.byName {
		out = append(out, name)
	}
	return out
}

// AgentBlocks returns how many entries agent has (0 when unknown).
func (t *Tree) AgentBlocks(agentName string) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if a, ok := t.byName[agentName]; ok {
		return t.agents[a].blocks
	}
	return 0
}

// agentID interns name, or returns -1 when the tree already tracks
// MaxAgents agents. Caller holds the write lock.
func (t *Tree) agentID(name string) int32 {
	if a, ok := t.byName[name]; ok {
		return a
	}
	var a int32
	if n := len(t.freeAgents); n > 0 {
		a = t.freeAgents[n-1]
		t.freeAgents = t.freeAgents[:n-1]
	} else {
		if len(t.agents) == MaxAgents {
			return -1
		}
		a = int32(len(t.agents))
		t.agents = append(t.agents, agent{})
		if need := int(a)/64 + 1; need > t.words {
			t.grow(need)
		}
	}
	t.agents[a] = agent{name: name}
	t.byName[name] = a
	return a
}

// grow widens every node's masks to words words.
func (t *Tree) grow(words int) {
	old := t.words
	masks := make([]uint64, len(t.nodes)*2*words)
	for n := range t.nodes {
		copy(masks[n*2*words:], t.masks[n*2*old:n*2*old+old])
		copy(masks[n*2*words+words:], t.masks[n*2*old+old:(n+1)*2*old])
	}
	t.masks, t.words = masks, words
}

// set marks (key, a) with src, makes it the most recent entry and
// returns it.
func (t *Tree) set(a int32, key uint64, src Source) int32 {
	if e, ok := t.ents[pair{key, a}]; ok {
		t.mark(e, src)
		t.lruUnlink(e)
		t.lruPushFront(e)
		return e
	}
	e := t.alloc()
	n, ok := t.keys[key]
	if !ok {
		n = t.newNode()
		t.keys[key] = n
	}
	t.nodes[n].refs++
	t.slab[e] = entry{key: key, agent: a, node: n}
	t.ents[pair{key, a}] = e
	t.mark(e, src)
	ag := &t.agents[a]
	if ag.head != 0 {
		t.slab[ag.head].agentPrev = e
	}
	t.slab[e].agentNext = ag.head
	ag.head = e
	ag.blocks++
	t.lruPushFront(e)
	t.n++
	return e
}

func (t *Tree) newNode() int32 {
	if k := len(t.freeNodes); k > 0 {
		n := t.freeNodes[k-1]
		t.freeNodes = t.freeNodes[:k-1]
		return n
	}
	t.nodes = append(t.nodes, node{})
	for range 2 * t.words {
		t.masks = append(t.masks, 0)
	}
	return int32(len(t.nodes) - 1)
}

// mark adds src to entry e and to its node's masks.
func (t *Tree) mark(e int32, src Source) {
	en := &t.slab[e]
	en.src |= src
	t.setBits(en, en.src)
}

// setBits makes e's bits in its node's masks say src.
func (t *Tree) setBits(en *entry, src Source) {
	w := t.words
	m := t.masks[int(en.node)*2*w:]
	j, bit := int(en.agent)/64, uint64(1)<<(en.agent%64)
	m[j] &^= bit
	m[w+j] &^= bit
	if src&Approximate != 0 {
		m[j] |= bit
	}
	if src&Precise != 0 {
		m[w+j] |= bit
	}
}

// alloc returns a free entry, evicting the least recently used one when
// the tree is full.
func (t *Tree) alloc() int32 {
	if t.n >= t.max {
		t.evicted++
		t.remove(t.slab[0].lruPrev)
	}
	if t.free != 0 {
		e := t.free
		t.free = t.slab[e].lruNext
		return e
	}
	t.slab = append(t.slab, entry{})
	return int32(len(t.slab) - 1)
}

// clear drops src from entry e, removing it when no source is left.
func (t *Tree) clear(e int32, src Source) {
	en := &t.slab[e]
	en.src &^= src
	if en.src == 0 {
		t.remove(e)
		return
	}
	t.setBits(en, en.src)
}

func (t *Tree) clearAgent(a int32, src Source) {
	for e := t.agents[a].head; e != 0; {
		next := t.slab[e].agentNext
		t.clear(e, src)
		e = next
	}
}

// remove unlinks e from every list and frees it.
func (t *Tree) remove(e int32) {
	en := &t.slab[e]
	t.lruUnlink(e)
	t.setBits(en, 0)
	delete(t.ents, pair{en.key, en.agent})
	nd := &t.nodes[en.node]
	if nd.refs--; nd.refs == 0 {
		delete(t.keys, en.key)
		t.freeNodes = append(t.freeNodes, en.node)
	}
	ag := &t.agents[en.agent]
	if en.agentPrev != 0 {
		t.slab[en.agentPrev].agentNext = en.agentNext
	} else {
		ag.head = en.agentNext
	}
	if en.agentNext != 0 {
		t.slab[en.agentNext].agentPrev = en.agentPrev
	}
	ag.blocks--
	*en = entry{lruNext: t.free}
	t.free = e
	t.n--
}

func (t *Tree) lruUnlink(e int32) {
	p, n := t.slab[e].lruPrev, t.slab[e].lruNext
	t.slab[p].lruNext = n
	t.slab[n].lruPrev = p
}

func (t *Tree) lruPushFront(e int32) {
	first := t.slab[0].lruNext
	t.slab[e].lruPrev = 0
	t.slab[e].lruNext = first
	t.slab[first].lruPrev = e
	t.slab[0].lruNext = e
}
