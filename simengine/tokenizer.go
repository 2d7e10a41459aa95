package simengine

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
)

// TokenizerFormat names the simulator's tokenizer file format, a JSON
// object
//
//	{"format":"switchyard-sim-tokenizer/v1","tokens":[{"id":0,"bytes":"AA=="},...]}
//
// mapping each token id to its bytes (base64). Ids need not be dense. A
// token's bytes need not be valid UTF-8 on their own: a character may be
// split between tokens, as in byte-level BPE vocabularies.
const TokenizerFormat = "switchyard-sim-tokenizer/v1"

// TokenizerFile is the name of the tokenizer file inside the zip archive
// that the gRPC service's GetTokenizer streams.
const TokenizerFile = "switchyard_tokenizer.json"

// Tokenizer is the simulator's deterministic vocabulary: the 256 single
// bytes (ids 0-255, the byte fallback), then " "+word for most generation
// words, with some words only available as several pieces, then a few
// tokenizer-only non-ASCII pieces that split UTF-8 characters ("café",
// "naïve", "日本"). Encoding is greedy longest match, so every string
// encodes and decodes back exactly. It is safe for concurrent use.
type Tokenizer struct {
	tokens [][]byte
	index  map[string]uint32
	maxLen int
	// words[i] are the ids of tokenText[i].
	words map[string][]uint32
}

// tokenizerExtras are tokenizer-only pieces that split multi-byte
// characters: é is C3 A9, ï is C3 AF, 日 is E6 97 A5, 本 is E6 9C AC.
var tokenizerExtras = []string{
	" caf\xc3", "\xa9", " na\xc3", "\xafve", "é", "ï",
	" \xe6\x97", "\xa5\xe6\x9c", "\xac", " 日本", "本",
}

// SimTokenizer returns the simulator's tokenizer, the one its gRPC service
// serves and encodes output with.
func SimTokenizer() *Tokenizer { return simTokenizer() }

var simTokenizer = sync.OnceValue(func() *Tokenizer {
	var pieces []string
	for i, w := range vocab {
		switch {
		case i%7 == 3 && len(w) >= 2:
			// Split in two: " wo" + "rd".
			k := (len(w) + 1) / 2
			pieces = append(pieces, " "+w[:k], w[k:])
		case i%11 == 5:
			// No token of its own: it encodes through other pieces and
			// single bytes.
		default:
			pieces = append(pieces, " "+w)
		}
	}
	pieces = append(pieces, tokenizerExtras...)
	t := &Tokenizer{index: make(map[string]uint32, 256+len(pieces))}
	for b := range 256 {
		t.add([]byte{byte(b)})
	}
	for _, p := range pieces {
		if _, dup := t.index[p]; !dup {
			t.add([]byte(p))
		}
	}
	t.words = make(map[string][]uint32, len(vocab))
	for _, s := range tokenText {
		t.words[s], _ = t.Encode(s) // every byte is a token
	}
	return t
})

func (t *Tokenizer) add(b []byte) {
	t.index[string(b)] = uint32(len(t.tokens))
	t.tokens = append(t.tokens, b)
	t.maxLen = max(t.maxLen, len(b))
}

// Size returns the number of token ids (the vocabulary size).
func (t *Tokenizer) Size() int { return len(t.tokens) }

// Token returns the bytes of token id; the slice must not be modified.
func (t *Tokenizer) Token(id uint32) ([]byte, bool) {
	if int64(id) >= int64(len(t.tokens)) || t.tokens[id] == nil {
		return nil, false
	}
	return t.tokens[id], true
}

// Encode returns the token ids of s, by greedy longest match. It fails
// only for a parsed tokenizer without a token for some byte of s.
func (t *Tokenizer) Encode(s string) ([]uint32, error) {
	if ids, ok := t.words[s]; ok {
		return ids, nil
	}
	var ids []uint32
	for i := 0; i < len(s); {
		l := min(t.maxLen, len(s)-i)
		for ; l > 0; l-- {
			if id, ok := t.index[s[i:i+l]]; ok {
				ids = append(ids, id)
				break
			}
		}
		if l == 0 {
			return nil, fmt.Errorf("simengine: no token for byte %#x at offset %d", s[i], i)
		}
		i += l
	}
	return ids, nil
}

// Decode returns the bytes of ids; an unknown id is an error.
func (t *Tokenizer) Decode(ids []uint32) ([]byte, error) {
	var b []byte
	for _, id := range ids {
		tok, ok := t.Token(id)
		if !ok {
			return nil, fmt.Errorf("simengine: unknown token id %d", id)
		}
		b = append(b, tok...)
	}
	return b, nil
}

type tokenizerJSON struct {
	Format string       `json:"format"`
	Tokens []tokenEntry `json:"tokens"`
}

type tokenEntry struct {
	ID    uint32 `json:"id"`
	Bytes []byte `json:"bytes"` // base64 in JSON
}

// MarshalJSON writes the tokenizer in [TokenizerFormat].
func (t *Tokenizer) MarshalJSON() ([]byte, error) {
	f := tokenizerJSON{Format: TokenizerFormat, Tokens: make([]tokenEntry, 0, len(t.tokens))}
	for id, b := range t.tokens {
		if b != nil {
			f.Tokens = append(f.Tokens, tokenEntry{ID: uint32(id), Bytes: b})
		}
	}
	return json.Marshal(f)
}

// ParseTokenizer reads a tokenizer in [TokenizerFormat].
func ParseTokenizer(data []byte) (*Tokenizer, error) {
	var f tokenizerJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("simengine: tokenizer: %w", err)
	}
	if f.Format != TokenizerFormat {
		return nil, fmt.Errorf("simengine: tokenizer format %q, want %q", f.Format, TokenizerFormat)
	}
	if len(f.Tokens) == 0 {
		return nil, errors.New("simengine: tokenizer has no tokens")
	}
	t := &Tokenizer{index: make(map[string]uint32, len(f.Tokens))}
	for _, tok := range f.Tokens {
		if tok.ID >= 1<<24 {
			return nil, fmt.Errorf("simengine: tokenizer: id %d too large", tok.ID)
		}
		for int(tok.ID) >= len(t.tokens) {
			t.tokens = append(t.tokens, nil)
		}
		if t.tokens[tok.ID] != nil || len(tok.Bytes) == 0 {
			return nil, fmt.Errorf("simengine: tokenizer: id %d duplicate or empty", tok.ID)
		}
		t.tokens[tok.ID] = tok.Bytes
		if _, dup := t.index[string(tok.Bytes)]; !dup {
			t.index[string(tok.Bytes)] = tok.ID
		}
		t.maxLen = max(t.maxLen, len(tok.Bytes))
	}
	return t, nil
}
