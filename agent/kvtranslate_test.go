package agent

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/simengine"
)

// vllmLike is a stand-in for a vLLM engine's prefix cache as its KV
// events show it: a ChatML template (not the broker's rendering), the
// simulator's byte-level tokenizer, blocks named by a seeded hash chain
// the agent cannot compute.
type vllmLike struct {
	bs   int
	seed uint64
	held map[uint64]bool
}

func newVLLMLike(bs int) *vllmLike {
	return &vllmLike{bs: bs, seed: 0xdeadbeef, held: map[uint64]bool{}}
}

func chatML(msgs []affinity.Message) string {
	var sb strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&sb, "<|im_start|>%s\n%s<|im_end|>\n", m.Role, m.Content)
	}
	sb.WriteString("<|im_start|>assistant\n")
	return sb.String()
}

// tokenize is the engine's /tokenize answer for msgs.
func (v *vllmLike) tokenize(t testing.TB, msgs []affinity.Message) oaiformat.TokenizeResponse {
	t.Helper()
	tok := simengine.SimTokenizer()
	ids, err := tok.Encode(chatML(msgs))
	if err != nil {
		t.Fatal(err)
	}
	r := oaiformat.TokenizeResponse{Count: len(ids), Tokens: ids}
	for _, id := range ids {
		b, _ := tok.Token(id)
		r.TokenStrs = append(r.TokenStrs, oaiformat.ByteLevelTokenStr(b))
	}
	return r
}

// hashes returns the engine's block hashes of ids' full blocks.
func (v *vllmLike) hashes(ids []uint32) []uint64 {
	var out []uint64
	parent := v.seed
	for j := 0; (j+1)*v.bs <= len(ids); j++ {
		parent = prefixID(parent^0x5555, ids[j*v.bs:(j+1)*v.bs])
		out = append(out, parent)
	}
	return out
}

// run caches ids (a prompt, maybe with its output) and returns the
// BlockStored event of the blocks it did not hold, as vLLM publishes it.
func (v *vllmLike) run(ids []uint32) []kvevents.Event {
	hs := v.hashes(ids)
	first := 0
	for first < len(hs) && v.held[hs[first]] {
		first++
	}
	if first == len(hs) {
		return nil
	}
	e := kvevents.Event{Kind: kvevents.BlockStored, Hashes: hs[first:], TokenIDs: ids[first*v.bs : len(hs)*v.bs], BlockSize: v.bs, Medium: kvevents.MediumGPU}
	if first > 0 {
		e.Parent, e.HasParent = hs[first-1], true
	}
	for _, h := range hs[first:] {
		v.held[h] = true
	}
	return []kvevents.Event{e}
}

type kvCounts map[string]int

func newTestTranslator(maxBlocks, maxPrefixes int) (*kvTranslator, kvCounts) {
	c := kvCounts{}
	return newKVTranslator(16, 16, maxBlocks, maxPrefixes, func(o string, n int) { c[o] += n }), c
}

// learnMsgs tokenizes msgs with v and teaches tr.
func learnMsgs(t testing.TB, tr *kvTranslator, v *vllmLike, msgs []affinity.Message) (oaiformat.TokenizeResponse, kvevents.Forward, bool) {
	t.Helper()
	resp := v.tokenize(t, msgs)
	pt := promptTokens{Prompt: oaiformat.Prompt{Chat: true, Messages: msgs}, IDs: resp.Tokens}
	pt.Text, pt.Ends = oaiformat.TokenText(nil, nil, resp.TokenStrs)
	plan, aligned := planPrompt(&pt, tr.blockSize, tr.keyBlock)
	if !aligned {
		t.Fatal("prompt not aligned")
	}
	f, ok := tr.learn(plan)
	return resp, f, ok
}

func batch(seq uint64, events []kvevents.Event) kvevents.Update {
	return kvevents.Update{Seq: seq, Batch: kvevents.Batch{Events: events}}
}

func words(tag string, n int) string {
	var sb strings.Builder
	sb.WriteString(tag)
	for i := range n {
		fmt.Fprintf(&sb, " w%d", i%37)
	}
	return sb.String()
}

func conversation(tag string, systemWords int, turns ...string) []affinity.Message {
	msgs := []affinity.Message{{Role: "system", Content: words(tag, systemWords)}}
	for i, c := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, affinity.Message{Role: role, Content: c})
	}
	return msgs
}

// wantPrefixOf checks that got is a prefix of the broker keys of msgs,
// missing at most the last two (the tail an engine's last full block does
// not reach), and returns its length.
func wantPrefixOf(t *testing.T, got []uint64, msgs []affinity.Message) int {
	t.Helper()
	keys := affinity.AppendChatKeys(nil, affinity.DefaultBlockSize, msgs)
	if len(got) > len(keys) || !slices.Equal(got, keys[:len(got)]) {
		t.Fatalf("stored %x, not a prefix of the broker keys %x", got, keys)
	}
	if len(got) < len(keys)-2 || len(got) == 0 {
		t.Fatalf("stored %d of %d broker keys", len(got), len(keys))
	}
	return len(got)
}

func TestKVTranslateStoredChain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		words int
	}{{"short", 60}, {"long", 4000}} {
		t.Run(tc.name, func(t *testing.T) {
			tr, counts := newTestTranslator(1<<10, 1<<12)
			v := newVLLMLike(16)
			msgs := conversation("chain", tc.words, "what is the answer")
			resp, _, late := learnMsgs(t, tr, v, msgs)
			if late {
				t.Fatal("a prompt with no engine block held translated something")
			}
			f, ok := tr.apply(batch(1, v.run(resp.Tokens)))
			if !ok {
				t.Fatal("nothing forwarded")
			}
			wantPrefixOf(t, f.Stored, msgs)
			if counts[KVBlockTranslated] != len(resp.Tokens)/16 || counts[KVBlockUnmatched] != 0 {
				t.Fatalf("counts %v, want %d translated", counts, len(resp.Tokens)/16)
			}
		})
	}
}

func TestKVTranslateEventsBeforeTokenize(t *testing.T) {
	tr, counts := newTestTranslator(1<<10, 1<<12)
	v := newVLLMLike(16)
	msgs := conversation("late", 120, "a question")
	ids := v.tokenize(t, msgs).Tokens
	// The engine stored the blocks before the agent's tokenize answered.
	if f, ok := tr.apply(batch(1, v.run(ids))); ok {
		t.Fatalf("forwarded %+v before the prompt was known", f)
	}
	_, f, ok := learnMsgs(t, tr, v, msgs)
	if !ok {
		t.Fatal("learning the prompt translated nothing")
	}
	wantPrefixOf(t, f.Stored, msgs)
	if counts[KVBlockLate] == 0 || counts[KVBlockUnmatched] != len(ids)/16 {
		t.Fatalf("counts %v", counts)
	}
}

func TestKVTranslateRemoved(t *testing.T) {
	tr, _ := newTestTranslator(1<<10, 1<<12)
	v := newVLLMLike(16)
	a := conversation("shared", 100, words("first", 40))
	b := conversation("shared", 100, words("another", 40))
	ra, _, _ := learnMsgs(t, tr, v, a)
	rb, _, _ := learnMsgs(t, tr, v, b)
	fa, _ := tr.apply(batch(1, v.run(ra.Tokens)))
	fb, _ := tr.apply(batch(2, v.run(rb.Tokens)))
	stored := append(slices.Clone(fa.Stored), fb.Stored...)
	// b's tail blocks stand for b's own keys only: removing them removes
	// those, and none that a still holds.
	hb := v.hashes(rb.Tokens)
	ha := v.hashes(ra.Tokens)
	var own []uint64
	for _, h := range hb {
		if !slices.Contains(ha, h) {
			own = append(own, h)
		}
	}
	f, _ := tr.apply(batch(3, []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: own}}))
	for _, k := range f.Removed {
		if slices.Contains(fa.Stored, k) {
			t.Fatalf("removed key %x that a's blocks still stand for", k)
		}
		if !slices.Contains(stored, k) {
			t.Fatalf("removed key %x never stored", k)
		}
	}
	if len(f.Removed) == 0 || len(fb.Stored) == 0 {
		t.Fatalf("b stored %x, its removal removed %x", fb.Stored, f.Removed)
	}
	// Removing every block removes every key.
	f, _ = tr.apply(batch(4, []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: ha}}))
	if !slices.Equal(f.Removed, fa.Stored) {
		t.Fatalf("removed %x, want a's %x", f.Removed, fa.Stored)
	}
	if len(tr.blocks) != 0 || len(tr.refs) != 0 {
		t.Fatalf("%d blocks, %d refs left", len(tr.blocks), len(tr.refs))
	}
}

func TestKVTranslateClearedAndResync(t *testing.T) {
	for _, tc := range []struct {
		name string
		up   kvevents.Update
	}{
		{"cleared", batch(2, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})},
		{"resync", kvevents.Update{Seq: 9, Resync: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, _ := newTestTranslator(1<<10, 1<<12)
			v := newVLLMLike(16)
			msgs := conversation("clear", 80, "q")
			resp, _, _ := learnMsgs(t, tr, v, msgs)
			ids := resp.Tokens
			tr.apply(batch(1, v.run(ids)))
			f, ok := tr.apply(tc.up)
			if !ok || f.Cleared != (tc.name == "cleared") || f.Resync != (tc.name == "resync") {
				t.Fatalf("forward %+v", f)
			}
			if len(tr.blocks) != 0 {
				t.Fatalf("%d blocks held after %s", len(tr.blocks), tc.name)
			}
			// The old hashes mean nothing now; the engine stores again.
			if f, ok := tr.apply(batch(10, []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: v.hashes(ids)}})); ok {
				t.Fatalf("forwarded %+v for blocks forgotten", f)
			}
			clear(v.held)
			f, _ = tr.apply(batch(11, v.run(ids)))
			wantPrefixOf(t, f.Stored, msgs)
		})
	}
}

func TestKVTranslateUnknownParentAndUnmatched(t *testing.T) {
	tr, counts := newTestTranslator(1<<10, 1<<12)
	v := newVLLMLike(16)
	msgs := conversation("orphan", 100, "q")
	resp, _, _ := learnMsgs(t, tr, v, msgs)
	ev := v.run(resp.Tokens)[0]
	// The engine's chain from a parent the agent never saw (it started
	// listening late): not translated, never guessed.
	orphan := ev
	orphan.Hashes, orphan.TokenIDs = ev.Hashes[2:], ev.TokenIDs[2*16:]
	orphan.Parent, orphan.HasParent = ev.Hashes[1], true
	if f, ok := tr.apply(batch(1, []kvevents.Event{orphan})); ok {
		t.Fatalf("forwarded %+v for an unknown parent", f)
	}
	if counts[KVBlockUnknownParent] != len(orphan.Hashes) {
		t.Fatalf("counts %v", counts)
	}
	// Tokens of a prompt the agent never sent, on a fresh engine.
	other := conversation("stranger", 100, "q")
	v = newVLLMLike(16)
	ids := v.tokenize(t, other).Tokens
	if f, ok := tr.apply(batch(2, v.run(ids))); ok {
		t.Fatalf("forwarded %+v for tokens of no recent prompt", f)
	}
	// Its first block is template markup alone, which the known prompt
	// shares (and which stands for no broker key).
	if counts[KVBlockUnmatched] != len(ids)/16-1 {
		t.Fatalf("counts %v", counts)
	}
}

func TestKVTranslateBounded(t *testing.T) {
	const maxBlocks, maxPrefixes = 32, 64
	tr, _ := newTestTranslator(maxBlocks, maxPrefixes)
	v := newVLLMLike(16)
	live := map[uint64]bool{}
	for i := range 40 {
		msgs := conversation(fmt.Sprintf("bound-%d", i), 60, "q")
		resp, _, _ := learnMsgs(t, tr, v, msgs)
		f, _ := tr.apply(batch(uint64(i), v.run(resp.Tokens)))
		for _, k := range f.Removed {
			delete(live, k)
		}
		for _, k := range f.Stored {
			live[k] = true
		}
		if len(tr.blocks) > maxBlocks || len(tr.prefixes) > maxPrefixes || len(tr.prefixRing) > maxPrefixes {
			t.Fatalf("after %d prompts: %d blocks, %d prefixes", i+1, len(tr.blocks), len(tr.prefixes))
		}
	}
	// What the brokers were told is held is what the translator holds:
	// an evicted block's keys were reported removed.
	if len(live) != len(tr.refs) {
		t.Fatalf("brokers hold %d keys, translator %d", len(live), len(tr.refs))
	}
	for k := range live {
		if tr.refs[k] == 0 {
			t.Fatalf("key %x reported stored, not held", k)
		}
	}
}

// TestKVTranslateMultiTurn: turn 2 re-sends turn 1 and its answer; the
// engine stores only the blocks it lacks, chained to turn 1's, including
// the blocks turn 1's output filled. Turn 2's keys are all translated.
func TestKVTranslateMultiTurn(t *testing.T) {
	tr, counts := newTestTranslator(1<<10, 1<<12)
	v := newVLLMLike(16)
	answer := " " + words("answer", 40)
	turn1 := conversation("multi", 90, "first question")
	r1, _, _ := learnMsgs(t, tr, v, turn1)
	// The engine caches the prompt and, once done, the blocks the output
	// filled.
	out, err := simengine.SimTokenizer().Encode(answer)
	if err != nil {
		t.Fatal(err)
	}
	f1, _ := tr.apply(batch(1, v.run(append(slices.Clone(r1.Tokens), out...))))
	n1 := wantPrefixOf(t, f1.Stored, turn1)

	turn2 := append(slices.Clone(turn1), affinity.Message{Role: "assistant", Content: answer}, affinity.Message{Role: "user", Content: words("second", 50)})
	// Tokenize answers first this time; the engine's events follow.
	r2, fLate, _ := learnMsgs(t, tr, v, turn2)
	f2, _ := tr.apply(batch(2, v.run(r2.Tokens)))
	all := append(append(slices.Clone(f1.Stored), fLate.Stored...), f2.Stored...)
	n2 := wantPrefixOf(t, all, turn2)
	if n2 <= n1 {
		t.Fatalf("turn 2 translated %d keys, turn 1 %d", n2, n1)
	}
	if len(f2.Stored) == 0 || len(fLate.Stored) == 0 {
		t.Fatalf("turn 2: its new blocks translated %x, turn 1's output blocks %x", f2.Stored, fLate.Stored)
	}
	if counts[KVBlockLate] == 0 {
		t.Fatalf("counts %v: turn 1's output blocks were not translated late", counts)
	}
}

// TestKVTranslateCoversOnlyCachedText: an engine holding only a prompt's
// first blocks stands for the broker keys of the text those tokens cover,
// template markup aside, and no more.
func TestKVTranslateCoversOnlyCachedText(t *testing.T) {
	for _, blocks := range []int{2, 5, 9} {
		t.Run(fmt.Sprint(blocks), func(t *testing.T) {
			tr, _ := newTestTranslator(1<<10, 1<<12)
			v := newVLLMLike(16)
			msgs := conversation("partial", 300, "q")
			resp, _, _ := learnMsgs(t, tr, v, msgs)
			f, _ := tr.apply(batch(1, v.run(resp.Tokens[:blocks*16])))
			text, _ := oaiformat.TokenText(nil, nil, resp.TokenStrs[:blocks*16])
			content, ok := strings.CutPrefix(string(text), "<|im_start|>system\n")
			if !ok {
				t.Fatalf("engine text %q", text)
			}
			// Every key of the covered text, a last partial word counted
			// as a word: an upper bound, and one fewer a lower one.
			covered := affinity.AppendKeys(nil, 16, "system: "+content)
			if n := len(f.Stored); n > len(covered) || n < len(covered)-1 {
				t.Fatalf("%d blocks (%q) stand for %d keys, the text they cover makes %d", blocks, text, n, len(covered))
			}
		})
	}
}

// FuzzKVTranslatePlan: whatever an engine answers to /tokenize, planning
// never panics and names only keys of the prompt, in order.
func FuzzKVTranslatePlan(f *testing.F) {
	f.Add("system", "you are kind", "user", "hi there", "<|im_start|>system\nyou are kind<|im_end|>\n<|im_start|>user\nhi there", uint8(3))
	f.Add("a", "", "b", "x", "ĠxĠyĊ", uint8(1))
	f.Fuzz(func(t *testing.T, r1, c1, r2, c2, engineText string, tokLen uint8) {
		msgs := []affinity.Message{{Role: r1, Content: c1}, {Role: r2, Content: c2}}
		n := int(tokLen%7) + 1
		var strs []string
		var ids []uint32
		for i := 0; i < len(engineText); i += n {
			strs = append(strs, engineText[i:min(i+n, len(engineText))])
			ids = append(ids, uint32(i))
		}
		pt := promptTokens{Prompt: oaiformat.Prompt{Chat: true, Messages: msgs}, IDs: ids}
		pt.Text, pt.Ends = oaiformat.TokenText(nil, nil, strs)
		if len(pt.Ends) != len(strs) {
			t.Fatalf("%d ends for %d tokens", len(pt.Ends), len(strs))
		}
		plan, _ := planPrompt(&pt, 2, 2)
		keys := affinity.AppendChatKeys(nil, 2, msgs)
		var named []uint64
		for _, ks := range plan.keys {
			named = append(named, ks...)
		}
		if len(named) > len(keys) || !slices.Equal(named, keys[:len(named)]) {
			t.Fatalf("named %x of keys %x", named, keys)
		}
	})
}
