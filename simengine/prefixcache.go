package simengine

import (
	"sync"
	"sync/atomic"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/kvevents"
)

// DefaultPrefixCacheBlocks is cmd/sim-engine's prefix cache size: 4096
// blocks of 16 tokens, 64k tokens, a small GPU's KV cache.
const DefaultPrefixCacheBlocks = 4096

// prefixCache is a vLLM-style automatic prefix cache: an LRU of full
// blocks named by chained hashes, so that a request skips the prefill of
// its longest cached prefix. Blocks are the token-less pieces of
// [affinity.Hasher] (a piece is a prompt word, the simulator's token), and
// a block's hash is the broker's block key of the same text: the engine's
// KV events name what the broker can look up. See docs/affinity.md.
//
// Unlike vLLM, blocks in use by a running request can be evicted; only
// their timing matters here, and it is decided when the request starts.
type prefixCache struct {
	blockSize int
	capacity  int
	pub       *kvevents.Publisher // nil: no events

	queries atomic.Int64 // prompt tokens looked up
	hits    atomic.Int64 // prompt tokens found cached

	// mu guards the LRU and orders the published batches like the changes.
	mu    sync.Mutex
	m     map[uint64]*cacheBlock
	head  cacheBlock // sentinel: head.next is the most recent
	chain map[uint64]struct{}
}

type cacheBlock struct {
	key        uint64
	prev, next *cacheBlock
}

func newPrefixCache(blocks, blockSize int, pub *kvevents.Publisher) *prefixCache {
	c := &prefixCache{
		blockSize: blockSize,
		capacity:  blocks,
		pub:       pub,
		m:         make(map[uint64]*cacheBlock, blocks),
		chain:     make(map[uint64]struct{}),
	}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

// prefixRun is one request's view of the cache: its hasher runs over the
// prompt, then over the generated text.
type prefixRun struct {
	h *affinity.Hasher
	// cached is how many prompt tokens were found cached.
	cached int
}

// begin looks prompt up when the request is scheduled and returns how
// much of it is cached. As vLLM does, at most promptTokens-1 tokens hit,
// since the last prompt token must be computed for its logits.
func (c *prefixCache) begin(prompt string, promptTokens int) *prefixRun {
	r := &prefixRun{h: affinity.NewHasher(c.blockSize)}
	r.h.RecordPieceIDs(c.pub != nil)
	_, _ = r.h.WriteString(prompt)
	keys := r.h.Keys()
	limit := 0
	if promptTokens > 0 {
		limit = min(len(keys), (promptTokens-1)/c.blockSize)
	}
	c.mu.Lock()
	n := 0
	for n < limit && c.m[keys[n]] != nil {
		n++
	}
	for i := n - 1; i >= 0; i-- {
		c.touch(c.m[keys[i]])
	}
	c.mu.Unlock()
	r.cached = n * c.blockSize
	c.queries.Add(int64(promptTokens))
	c.hits.Add(int64(r.cached))
	return r
}

// store caches the full blocks the run has hashed so far.
func (c *prefixCache) store(r *prefixRun) {
	keys := r.h.Keys()
	if len(keys) > c.capacity {
		keys = keys[:c.capacity] // the head of the chain is what pays
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.chain)
	missing := 0
	for _, k := range keys {
		c.chain[k] = struct{}{}
		if c.m[k] == nil {
			missing++
		}
	}
	if missing == 0 {
		for i := len(keys) - 1; i >= 0; i-- {
			c.touch(c.m[keys[i]])
		}
		return
	}
	// Evict the least recently used blocks of other prompts first.
	var removed []uint64
	for b := c.head.prev; len(c.m)+missing > c.capacity && b != &c.head; {
		prev := b.prev
		if _, mine := c.chain[b.key]; !mine {
			c.unlink(b)
			delete(c.m, b.key)
			removed = append(removed, b.key)
		}
		b = prev
	}
	// Leaf first, so that the head of the chain is the most recent.
	isNew := make([]bool, len(keys))
	for i := len(keys) - 1; i >= 0; i-- {
		b := c.m[keys[i]]
		if b == nil {
			b = &cacheBlock{key: keys[i]}
			c.m[keys[i]] = b
			isNew[i] = true
		} else {
			c.unlink(b)
		}
		c.pushFront(b)
	}
	if c.pub != nil {
		c.publish(r, keys, isNew, removed)
	}
}

// publish sends one batch: the evictions, then each run of new blocks as
// a BlockStored whose parent is the block before it, as vLLM does.
func (c *prefixCache) publish(r *prefixRun, keys []uint64, isNew []bool, removed []uint64) {
	var events []kvevents.Event
	if len(removed) > 0 {
		events = append(events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: removed, Medium: kvevents.MediumGPU})
	}
	ids := r.h.PieceIDs()
	for i := 0; i < len(keys); {
		if !isNew[i] {
			i++
			continue
		}
		j := i
		for j < len(keys) && isNew[j] {
			j++
		}
		ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: keys[i:j], BlockSize: c.blockSize, Medium: kvevents.MediumGPU}
		if i > 0 {
			ev.Parent, ev.HasParent = keys[i-1], true
		}
		if hi := j * c.blockSize; hi <= len(ids) {
			ev.TokenIDs = ids[i*c.blockSize : hi]
		}
		events = append(events, ev)
		i = j
	}
	// Publishing only queues the message; it fails once the engine closes.
	_ = c.pub.Publish(events)
}

func (c *prefixCache) touch(b *cacheBlock) {
	c.unlink(b)
	c.pushFront(b)
}

func (c *prefixCache) unlink(b *cacheBlock) {
	b.prev.next, b.next.prev = b.next, b.prev
}

func (c *prefixCache) pushFront(b *cacheBlock) {
	b.prev, b.next = &c.head, c.head.next
	c.head.next.prev = b
	c.head.next = b
}

// len returns the blocks cached now.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
