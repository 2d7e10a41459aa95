package agent

import (
	"math"
	"strings"
	"sync"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/oaiformat"
)

// KV-event hashing, Config.KVEventsHash.
const (
	// KVHashBroker: the engine's block hashes are the broker's block keys
	// (sim-engine's default); events are forwarded as they are.
	KVHashBroker = "broker"
	// KVHashVLLM: the engine's block hashes are vLLM's, of token ids; the
	// agent translates them to broker keys (docs/affinity.md).
	KVHashVLLM = "vllm"
)

// Defaults of the translation's bounds.
const (
	// DefaultKVTranslateBlocks bounds the engine blocks the translator
	// remembers: more than a large GPU's prefix cache (2^17 blocks of 16
	// tokens is 2M tokens).
	DefaultKVTranslateBlocks = 1 << 17
	// DefaultKVTranslatePrefixes bounds the token prefixes of recent
	// prompts it remembers, one per engine block of each prompt.
	DefaultKVTranslatePrefixes = 1 << 16
	// maxKeysPerBlock bounds the broker keys one engine block stands for.
	maxKeysPerBlock = 8
)

// Outcomes of translated blocks (switchyard_agent_kv_blocks_total).
const (
	KVBlockTranslated    = "translated"     // named broker keys as it arrived
	KVBlockLate          = "late"           // named broker keys once its prompt was tokenized
	KVBlockUnmatched     = "unmatched"      // its tokens matched no recent prompt (yet)
	KVBlockUnknownParent = "unknown_parent" // its parent was never seen: not translated
)

// kvTranslator maps an engine's block hashes (vLLM's, of token ids,
// seeded per process) to the broker's block keys (of prompt text). It
// knows an engine block by its *prefix id*: a hash of the token ids from
// the start of the prompt to the end of the block, which the agent
// computes both from a BlockStored event (the parent's prefix id and the
// block's token_ids) and from the engine's tokenization of a prompt it
// sent (learnPrompt). A prompt tells, per prefix id, the broker keys
// whose text those tokens cover; an engine block with that prefix id
// stands for them. Whichever comes second, the event or the prompt,
// makes the translation, so tokenizing may run beside the engine call.
//
// Memory is bounded: engine blocks in an LRU (maxBlocks; an evicted one
// counts as removed), prefix ids of recent prompts in a FIFO
// (maxPrefixes). A broker key is reported stored while at least one
// engine block standing for it is held, removed when the last goes.
type kvTranslator struct {
	mu         sync.Mutex
	blockSize  int // the engine's, in tokens
	keyBlock   int // the brokers', in words
	maxBlocks  int
	maxPrefix  int
	blocks     map[uint64]*engineBlock // engine hash →
	byPrefix   map[uint64]*engineBlock // prefix id → the block held for it
	lru        engineBlock             // sentinel: lru.next is the most recent
	refs       map[uint64]int32        // broker key → blocks standing for it
	prefixes   map[uint64][]uint64     // prefix id → broker keys it covers first
	prefixRing []uint64
	ringNext   int
	lastSeq    uint64

	count func(outcome string, n int) // metrics; never nil
}

type engineBlock struct {
	hash, prefix uint64
	keys         []uint64 // broker keys this block stands for
	prev, next   *engineBlock
}

func newKVTranslator(blockSize, keyBlock, maxBlocks, maxPrefixes int, count func(string, int)) *kvTranslator {
	if blockSize <= 0 {
		blockSize = affinity.DefaultBlockSize
	}
	if keyBlock <= 0 {
		keyBlock = affinity.DefaultBlockSize
	}
	if count == nil {
		count = func(string, int) {}
	}
	t := &kvTranslator{
		blockSize: blockSize,
		keyBlock:  keyBlock,
		maxBlocks: max(1, maxBlocks),
		maxPrefix: max(1, maxPrefixes),
		count:     count,
	}
	t.resetBlocks()
	t.resetPrefixes()
	return t
}

func (t *kvTranslator) resetBlocks() {
	t.blocks = make(map[uint64]*engineBlock)
	t.byPrefix = make(map[uint64]*engineBlock)
	t.refs = make(map[uint64]int32)
	t.lru.prev, t.lru.next = &t.lru, &t.lru
}

func (t *kvTranslator) resetPrefixes() {
	t.prefixes = make(map[uint64][]uint64)
	t.prefixRing = make([]uint64, 0, min(t.maxPrefix, 1024))
	t.ringNext = 0
}

// prefixRoot is the prefix id before the first token.
const prefixRoot = 0x243f6a8885a308d3

// prefixID chains block's token ids onto parent's prefix id (FNV-1a,
// splitmix-finalised, as affinity's keys): equal ids mean equal token
// prefixes, whatever the engine's own hash seed.
func prefixID(parent uint64, block []uint32) uint64 {
	h := uint64(14695981039346656037)
	for i := range 8 {
		h ^= (parent >> (8 * i)) & 0xff
		h *= 1099511628211
	}
	for _, tok := range block {
		for i := range 4 {
			h ^= uint64(tok>>(8*i)) & 0xff
			h *= 1099511628211
		}
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// promptTokens is a prompt as the engine tokenized it, beside the
// broker's view of it.
type promptTokens struct {
	Prompt oaiformat.Prompt
	// IDs are the engine's token ids; Text their text (oaiformat.TokenText)
	// and Ends the offset in Text just past each token.
	IDs  []uint32
	Text []byte
	Ends []int
}

// promptPlan is what a prompt teaches the translator: per full engine
// block j, its prefix id and the broker keys first covered by tokens
// [0, (j+1)·bs).
type promptPlan struct {
	prefix []uint64
	keys   [][]uint64
}

// planPrompt aligns the engine's text with the broker's: each message's
// content is found, in order, in the engine's rendering; text outside
// contents (template markup) covers nothing. A broker block is covered
// once the engine's text reaches the end of its last piece: for a piece
// of a role, the start of that message's content; for the closing
// "assistant:", the end of the prompt. aligned is false when no content
// was found (nothing can be translated).
func planPrompt(p *promptTokens, blockSize, keyBlock int) (plan promptPlan, aligned bool) {
	text := string(p.Text) // one copy, for strings.Index
	var keys []uint64
	var ends []affinity.BlockEnd
	var contents []string
	if p.Prompt.Chat {
		keys = affinity.AppendChatKeys(nil, keyBlock, p.Prompt.Messages)
		ends = affinity.ChatBlockEnds(nil, keyBlock, p.Prompt.Messages)
		contents = make([]string, len(p.Prompt.Messages))
		for i, m := range p.Prompt.Messages {
			contents[i] = m.Content
		}
	} else {
		keys = affinity.AppendKeys(nil, keyBlock, p.Prompt.Text)
		ends = affinity.PromptBlockEnds(nil, keyBlock, p.Prompt.Text)
		contents = []string{p.Prompt.Text}
	}
	// starts[i]: where content i begins in the engine's text; MaxInt once
	// one is not found (what follows cannot be placed).
	starts := make([]int, len(contents)+1)
	pos, found := 0, 0
	for i, c := range contents {
		k := -1
		if pos <= len(text) {
			k = strings.Index(text[pos:], c)
		}
		if k < 0 {
			for j := i; j < len(starts); j++ {
				starts[j] = math.MaxInt
			}
			break
		}
		starts[i] = pos + k
		pos += k + len(c)
		found++
	}
	if found == len(contents) {
		starts[len(contents)] = len(text) // the closing "assistant:"
	}
	need := make([]int, len(ends))
	for b, e := range ends {
		i, content := e.Tag/2, e.Tag%2 == 1
		switch {
		case starts[i] == math.MaxInt:
			need[b] = math.MaxInt
		case content:
			need[b] = starts[i] + e.Off
		default:
			need[b] = starts[i]
		}
	}
	full := len(p.IDs) / blockSize
	if len(p.Ends) < len(p.IDs) {
		full = 0
	}
	plan.prefix = make([]uint64, full)
	plan.keys = make([][]uint64, full)
	parent, covered := uint64(prefixRoot), 0
	for j := range full {
		parent = prefixID(parent, p.IDs[j*blockSize:(j+1)*blockSize])
		plan.prefix[j] = parent
		off := p.Ends[(j+1)*blockSize-1]
		first := covered
		for covered < len(need) && need[covered] <= off {
			covered++
		}
		if covered > first {
			plan.keys[j] = keys[first:covered]
		}
	}
	return plan, found > 0
}

// learn records a planned prompt and returns the forward of the broker
// keys it makes known for engine blocks already held (their events came
// first), or false when there are none. It is called with t.mu held.
func (t *kvTranslator) learn(plan promptPlan) (kvevents.Forward, bool) {
	var ops keyOps
	late := 0
	for j, pid := range plan.prefix {
		keys := plan.keys[j]
		if _, seen := t.prefixes[pid]; !seen {
			if len(t.prefixRing) < t.maxPrefix {
				t.prefixRing = append(t.prefixRing, pid)
			} else {
				delete(t.prefixes, t.prefixRing[t.ringNext])
				t.prefixRing[t.ringNext] = pid
				t.ringNext = (t.ringNext + 1) % t.maxPrefix
			}
		}
		t.prefixes[pid] = mergeKeys(t.prefixes[pid], keys)
		if b := t.byPrefix[pid]; b != nil && len(keys) > 0 {
			if t.addKeys(b, keys, &ops) {
				late++
			}
		}
	}
	if late > 0 {
		t.count(KVBlockLate, late)
	}
	f := ops.forward(t.lastSeq)
	return f, len(f.Stored) > 0
}

// mergeKeys returns old with the keys of add it lacks, at most
// maxKeysPerBlock.
func mergeKeys(old, add []uint64) []uint64 {
	for _, k := range add {
		if len(old) >= maxKeysPerBlock {
			break
		}
		if !containsKey(old, k) {
			old = append(old, k)
		}
	}
	return old
}

func containsKey(keys []uint64, k uint64) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// addKeys makes b stand for keys too; it reports whether b gained any.
func (t *kvTranslator) addKeys(b *engineBlock, keys []uint64, ops *keyOps) bool {
	gained := false
	for _, k := range keys {
		if len(b.keys) >= maxKeysPerBlock {
			break
		}
		if containsKey(b.keys, k) {
			continue
		}
		b.keys = append(b.keys, k)
		gained = true
		t.refs[k]++
		if t.refs[k] == 1 {
			ops.add(k, true)
		}
	}
	return gained
}

// drop forgets b: the broker keys no other block stands for are removed.
func (t *kvTranslator) drop(b *engineBlock, ops *keyOps) {
	for _, k := range b.keys {
		if t.refs[k]--; t.refs[k] <= 0 {
			delete(t.refs, k)
			ops.add(k, false)
		}
	}
	b.prev.next, b.next.prev = b.next, b.prev
	delete(t.blocks, b.hash)
	if t.byPrefix[b.prefix] == b {
		delete(t.byPrefix, b.prefix)
	}
}

func (t *kvTranslator) touch(b *engineBlock) {
	if b.prev != nil {
		b.prev.next, b.next.prev = b.next, b.prev
	}
	b.prev, b.next = &t.lru, t.lru.next
	t.lru.next.prev = b
	t.lru.next = b
}

// apply translates one batch of the engine's events into the forward the
// brokers apply; ok is false when it carries nothing.
func (t *kvTranslator) apply(u kvevents.Update) (kvevents.Forward, bool) {
	var ops keyOps
	t.lastSeq = u.Seq
	resync := u.Resync
	if resync {
		// Events were lost, or the engine restarted with a new hash
		// seed: what was known of its blocks may be wrong. The brokers
		// forget the agent's precise entries too.
		t.resetBlocks()
	}
	cleared := false
	var outcomes [4]int
	for i := range u.Batch.Events {
		e := &u.Batch.Events[i]
		if e.Medium != "" && e.Medium != kvevents.MediumGPU {
			continue
		}
		switch e.Kind {
		case kvevents.AllBlocksCleared:
			t.resetBlocks()
			ops = keyOps{}
			cleared = true
		case kvevents.BlockRemoved:
			for _, h := range e.Hashes {
				if b := t.blocks[h]; b != nil {
					t.drop(b, &ops)
				}
			}
		case kvevents.BlockStored:
			t.stored(e, &ops, &outcomes)
		}
	}
	for t.lru.prev != &t.lru && len(t.blocks) > t.maxBlocks {
		t.drop(t.lru.prev, &ops)
	}
	for i, o := range [...]string{KVBlockTranslated, KVBlockUnmatched, KVBlockUnknownParent} {
		if outcomes[i] > 0 {
			t.count(o, outcomes[i])
		}
	}
	f := ops.forward(u.Seq)
	f.Resync, f.Cleared = resync, cleared
	return f, resync || cleared || len(f.Stored) > 0 || len(f.Removed) > 0
}

// stored takes in one BlockStored event.
func (t *kvTranslator) stored(e *kvevents.Event, ops *keyOps, outcomes *[4]int) {
	bs := e.BlockSize
	if bs <= 0 {
		bs = t.blockSize
	}
	if bs != t.blockSize {
		// The engine's block size is the truth: what was planned with
		// another one names other prefixes.
		t.blockSize = bs
		t.resetPrefixes()
	}
	parent := uint64(prefixRoot)
	if e.LoraID != 0 {
		// An adapter's blocks hash apart from the base model's; the agent
		// does not know which adapter a prompt ran with.
		parent = prefixID(prefixRoot, []uint32{uint32(e.LoraID)})
	}
	if e.HasParent {
		pb := t.blocks[e.Parent]
		if pb == nil {
			outcomes[2] += len(e.Hashes)
			return
		}
		parent = pb.prefix
	}
	for k, h := range e.Hashes {
		if (k+1)*bs > len(e.TokenIDs) {
			outcomes[1] += len(e.Hashes) - k // no tokens to know it by
			return
		}
		pid := prefixID(parent, e.TokenIDs[k*bs:(k+1)*bs])
		b := t.blocks[h]
		if b == nil {
			b = &engineBlock{hash: h, prefix: pid}
			t.blocks[h] = b
		}
		t.byPrefix[pid] = b
		t.touch(b)
		if keys, ok := t.prefixes[pid]; ok {
			t.addKeys(b, keys, ops)
			outcomes[0]++
		} else {
			outcomes[1]++
		}
		parent = pid
	}
}

// keyOps nets a sequence of stored and removed broker keys: the last
// word on each key counts, in first-seen order.
type keyOps struct {
	order []uint64
	state map[uint64]bool
}

func (o *keyOps) add(k uint64, stored bool) {
	if o.state == nil {
		o.state = make(map[uint64]bool)
	}
	if _, seen := o.state[k]; !seen {
		o.order = append(o.order, k)
	}
	o.state[k] = stored
}

func (o *keyOps) forward(seq uint64) kvevents.Forward {
	f := kvevents.Forward{Seq: seq}
	for _, k := range o.order {
		if o.state[k] {
			f.Stored = append(f.Stored, k)
		} else {
			f.Removed = append(f.Removed, k)
		}
	}
	return f
}
