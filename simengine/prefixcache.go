package simengine

import (
	"crypto/sha256"
	"encoding/binary"
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
	// tokens, when set, names blocks as real vLLM does (KVHashTokens):
	// token ids of a ChatML rendering, hashes chained from seed.
	tokens *Tokenizer
	seed   uint64

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
	h blockHasher
	// cached is how many prompt tokens (words) were found cached.
	cached int
}

// blockHasher names a text's full blocks: *affinity.Hasher (blocks of
// words, broker keys) or *tokenHasher (blocks of token ids).
type blockHasher interface {
	WriteString(s string) (int, error)
	Keys() []uint64
	// PieceIDs are the token ids the blocks are made of.
	PieceIDs() []uint32
}

// begin looks r's prompt up when the request is scheduled and returns
// how much of it is cached. As vLLM does, at most all tokens but the last
// hit, since the last prompt token must be computed for its logits.
// promptTokens is the prompt's length in words, the unit of the timing
// model.
func (c *prefixCache) begin(req *request, promptTokens int) *prefixRun {
	r := &prefixRun{}
	total := promptTokens // in the cache's tokens
	if c.tokens != nil {
		th := &tokenHasher{tok: c.tokens, blockSize: c.blockSize, seed: c.seed}
		_, _ = th.WriteString(req.cacheText())
		total = len(th.ids)
		r.h = th
	} else {
		h := affinity.NewHasher(c.blockSize)
		h.RecordPieceIDs(c.pub != nil)
		_, _ = h.WriteString(req.prompt)
		r.h = h
	}
	keys := r.h.Keys()
	limit := 0
	if total > 0 {
		limit = min(len(keys), (total-1)/c.blockSize)
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
	hit := n * c.blockSize
	c.queries.Add(int64(total))
	c.hits.Add(int64(hit))
	r.cached = hit
	if total != promptTokens && total > 0 {
		r.cached = promptTokens * hit / total // the share of the prompt's words
	}
	return r
}

// tokenHasher names blocks of token ids as vLLM does: block i's hash is
// a hash of (block i-1's hash, its token ids), block 0's parent a
// per-process seed (vLLM's NONE_HASH). Text written to it is tokenized
// write by write: the prompt, then each generated token, as vLLM extends
// a request's token ids.
type tokenHasher struct {
	tok       *Tokenizer
	blockSize int
	seed      uint64
	ids       []uint32
	keys      []uint64
	buf       []byte
}

func (h *tokenHasher) WriteString(s string) (int, error) {
	ids, err := h.tok.Encode(s)
	if err != nil {
		return 0, err
	}
	h.ids = append(h.ids, ids...)
	return len(s), nil
}

func (h *tokenHasher) Keys() []uint64 {
	for n := len(h.keys); (n+1)*h.blockSize <= len(h.ids); n++ {
		parent := h.seed
		if n > 0 {
			parent = h.keys[n-1]
		}
		h.buf = binary.LittleEndian.AppendUint64(h.buf[:0], parent)
		for _, id := range h.ids[n*h.blockSize : (n+1)*h.blockSize] {
			h.buf = binary.LittleEndian.AppendUint32(h.buf, id)
		}
		sum := sha256.Sum256(h.buf)
		h.keys = append(h.keys, binary.BigEndian.Uint64(sum[24:])) // vLLM's int form keeps the low bytes
	}
	return h.keys
}

func (h *tokenHasher) PieceIDs() []uint32 { return h.ids }

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
