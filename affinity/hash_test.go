package affinity

import (
	"slices"
	"strings"
	"testing"
)

func words(n int, prefix string) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(prefix)
		sb.WriteByte(byte('a' + i%26))
	}
	return sb.String()
}

func TestKeys(t *testing.T) {
	tests := []struct {
		name      string
		text      string
		blockSize int
		blocks    int
		pieces    int
	}{
		{name: "empty", text: "", blockSize: 4, blocks: 0, pieces: 0},
		{name: "partial block has no key", text: "a b c", blockSize: 4, blocks: 0, pieces: 3},
		{name: "one block", text: "a b c d", blockSize: 4, blocks: 1, pieces: 4},
		{name: "two blocks and a tail", text: words(9, "w"), blockSize: 4, blocks: 2, pieces: 9},
		{name: "whitespace runs", text: " \t a \n\n b\u00a0c\u3000d  ", blockSize: 4, blocks: 1, pieces: 4},
		{name: "long word split", text: strings.Repeat("x", 3*MaxPieceBytes+1), blockSize: 4, blocks: 1, pieces: 4},
		{name: "default block size", text: words(33, "t"), blockSize: 0, blocks: 2, pieces: 33},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHasher(tt.blockSize)
			_, _ = h.WriteString(tt.text)
			if got := len(h.Keys()); got != tt.blocks {
				t.Errorf("blocks = %d, want %d", got, tt.blocks)
			}
			if got := h.Pieces(); got != tt.pieces {
				t.Errorf("pieces = %d, want %d", got, tt.pieces)
			}
			if got := AppendKeys(nil, tt.blockSize, tt.text); !slices.Equal(got, h.Keys()) {
				t.Errorf("AppendKeys = %x, Hasher = %x", got, h.Keys())
			}
		})
	}
}

func TestKeysArePrefixes(t *testing.T) {
	base := words(40, "p")
	a := AppendKeys(nil, 8, base+" one two three four five six seven eight")
	b := AppendKeys(nil, 8, base+" uno dos tres cuatro cinco seis siete ocho")
	if len(a) != 6 || len(b) != 6 {
		t.Fatalf("len = %d, %d, want 6", len(a), len(b))
	}
	if !slices.Equal(a[:5], b[:5]) {
		t.Errorf("the shared 40 words' keys differ: %x vs %x", a[:5], b[:5])
	}
	if a[5] == b[5] {
		t.Errorf("different sixth blocks have the same key %x", a[5])
	}
	// Same block content at another depth has another key: chained.
	c := AppendKeys(nil, 2, "x y x y")
	if c[0] == c[1] {
		t.Errorf("equal blocks at depths 0 and 1 share key %x", c[0])
	}
	// Word boundaries count: "ab c" is not "a bc".
	if AppendKeys(nil, 2, "ab c")[0] == AppendKeys(nil, 2, "a bc")[0] {
		t.Error(`"ab c" and "a bc" share a key`)
	}
}

func TestHasherSplitWrites(t *testing.T) {
	text := "system: you are helpful\nuser: tell me a story about a café in 日本\nassistant:"
	want := AppendKeys(nil, 3, text)
	for cut := range len(text) + 1 {
		if cut < len(text) && !isRuneStart(text[cut]) {
			continue
		}
		h := NewHasher(3)
		_, _ = h.WriteString(text[:cut])
		_, _ = h.WriteString(text[cut:])
		if got := h.Keys(); !slices.Equal(got, want) {
			t.Fatalf("cut at %d: %x, want %x", cut, got, want)
		}
	}
}

func isRuneStart(b byte) bool { return b&0xc0 != 0x80 }

func TestChatKeysMatchRenderedText(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: words(20, "s")},
		{Role: "user", Content: "hello there " + words(10, "u")},
	}
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString(m.Role + ": " + m.Content + "\n")
	}
	sb.WriteString("assistant:")
	if got, want := AppendChatKeys(nil, 4, msgs), AppendKeys(nil, 4, sb.String()); !slices.Equal(got, want) {
		t.Errorf("chat keys %x, rendered %x", got, want)
	}
}

func TestContinuationAfterKeys(t *testing.T) {
	// A simulated engine hashes the prompt, then appends generated tokens
	// (" word" each); the result must equal the keys of the whole text.
	h := NewHasher(4)
	_, _ = h.WriteString("a b c d e f")
	_ = h.Keys()
	_, _ = h.WriteString(" g")
	_, _ = h.WriteString(" h i")
	if got, want := h.Keys(), AppendKeys(nil, 4, "a b c d e f g h i"); !slices.Equal(got, want) {
		t.Errorf("continued %x, whole %x", got, want)
	}
}

func TestPieceIDs(t *testing.T) {
	h := NewHasher(2)
	h.RecordPieceIDs(true)
	_, _ = h.WriteString("a b a")
	_ = h.Keys()
	ids := h.PieceIDs()
	if len(ids) != 3 || ids[0] != ids[2] || ids[0] == ids[1] {
		t.Errorf("ids = %v", ids)
	}
}

func TestChatBlockEnds(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: strings.Repeat("you are a careful assistant ", 9)},
		{Role: "user", Content: "a question with averyveryverylongwordthatsplitsintopieces in it"},
		{Role: "assistant", Content: strings.Repeat("an answer ", 12)},
		{Role: "user", Content: "and more"},
	}
	keys := AppendChatKeys(nil, 4, msgs)
	ends := ChatBlockEnds(nil, 4, msgs)
	if len(ends) != len(keys) {
		t.Fatalf("%d ends for %d keys", len(ends), len(keys))
	}
	// The text up to each block end, rendered, keys to exactly the
	// blocks up to that one.
	for b, e := range ends {
		var text string
		i := e.Tag / 2
		for _, m := range msgs[:min(i, len(msgs))] {
			text += m.Role + ": " + m.Content + "\n"
		}
		switch {
		case e.Tag == ChatTail(len(msgs)):
			text += "assistant:"
		case e.Tag%2 == 1:
			text += msgs[i].Role + ": " + msgs[i].Content[:e.Off]
		default:
			text += (msgs[i].Role + ": ")[:e.Off]
		}
		got := AppendKeys(nil, 4, text)
		if len(got) != b+1 || got[b] != keys[b] {
			t.Fatalf("block %d ends at %+v: the text up to it (%q) makes %d keys", b, e, text, len(got))
		}
	}
	pe := PromptBlockEnds(nil, 4, msgs[1].Content)
	if len(pe) != len(AppendKeys(nil, 4, msgs[1].Content)) {
		t.Fatalf("prompt ends %v", pe)
	}
}
