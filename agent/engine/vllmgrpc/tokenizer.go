package vllmgrpc

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// TokenizerFormat and TokenizerFile are the simulator's tokenizer file
// format and its name inside a GetTokenizer archive (the same as package
// simengine's; they are repeated so that the adapter does not depend on the
// simulator):
//
//	{"format":"switchyard-sim-tokenizer/v1","tokens":[{"id":0,"bytes":"AA=="},...]}
//
// maps each token id to its bytes, base64.
const (
	TokenizerFormat = "switchyard-sim-tokenizer/v1"
	TokenizerFile   = "switchyard_tokenizer.json"
)

// Vocabulary maps token ids to their bytes; a token's bytes may be part of
// a UTF-8 character.
type Vocabulary interface {
	Token(id uint32) ([]byte, bool)
}

// Tokens is a Vocabulary held in memory, indexed by id (nil: no token).
type Tokens [][]byte

// Token returns the bytes of id.
func (t Tokens) Token(id uint32) ([]byte, bool) {
	if int64(id) >= int64(len(t)) || t[id] == nil {
		return nil, false
	}
	return t[id], true
}

// ParseTokenizer reads a tokenizer in TokenizerFormat, or a zip archive (as
// GetTokenizer streams it) holding one as TokenizerFile.
func ParseTokenizer(data []byte) (Tokens, error) {
	if bytes.HasPrefix(data, []byte("PK\x03\x04")) {
		zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return nil, fmt.Errorf("tokenizer archive: %w", err)
		}
		f, err := zr.Open(TokenizerFile)
		if err != nil {
			return nil, fmt.Errorf("tokenizer archive: %w (only the %s format is supported)", err, TokenizerFormat)
		}
		defer f.Close()
		if data, err = io.ReadAll(io.LimitReader(f, 256<<20)); err != nil {
			return nil, fmt.Errorf("tokenizer archive: %w", err)
		}
	}
	var file struct {
		Format string `json:"format"`
		Tokens []struct {
			ID    uint32 `json:"id"`
			Bytes []byte `json:"bytes"`
		} `json:"tokens"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if file.Format != TokenizerFormat {
		return nil, fmt.Errorf("tokenizer format %q: want %q", file.Format, TokenizerFormat)
	}
	if len(file.Tokens) == 0 {
		return nil, errors.New("tokenizer has no tokens")
	}
	var t Tokens
	for _, tok := range file.Tokens {
		if tok.ID >= 1<<24 {
			return nil, fmt.Errorf("tokenizer: id %d too large", tok.ID)
		}
		for int(tok.ID) >= len(t) {
			t = append(t, nil)
		}
		if t[tok.ID] != nil || len(tok.Bytes) == 0 {
			return nil, fmt.Errorf("tokenizer: id %d duplicate or empty", tok.ID)
		}
		t[tok.ID] = tok.Bytes
	}
	return t, nil
}

// checkSHA256 verifies an archive against GetTokenizer's hex digest.
func checkSHA256(data []byte, want string) error {
	if want == "" {
		return nil
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("tokenizer archive sha256 %s, want %s", got, want)
	}
	return nil
}

// Detokenizer turns token ids into text incrementally. The bytes of a
// UTF-8 character split between tokens are held back until the character
// is complete, so no U+FFFD stands for a character that merely spans
// tokens; a byte that cannot start or continue a valid character becomes
// U+FFFD, as soon as that is certain. The text of all Add calls followed by
// Flush is exactly DecodeAll of all the ids.
type Detokenizer struct {
	v       Vocabulary
	pending []byte
}

// NewDetokenizer returns a detokenizer over v.
func NewDetokenizer(v Vocabulary) *Detokenizer { return &Detokenizer{v: v} }

// Add appends to dst the text that ids complete.
func (d *Detokenizer) Add(dst []byte, ids []uint32) ([]byte, error) {
	for _, id := range ids {
		b, ok := d.v.Token(id)
		if !ok {
			return dst, fmt.Errorf("unknown token id %d", id)
		}
		d.pending = append(d.pending, b...)
	}
	dst, n := appendValid(dst, d.pending, false)
	d.pending = d.pending[:copy(d.pending, d.pending[n:])]
	return dst, nil
}

// Flush appends what is held back, an incomplete character at the end of
// the output, as U+FFFD per byte.
func (d *Detokenizer) Flush(dst []byte) []byte {
	dst, _ = appendValid(dst, d.pending, true)
	d.pending = d.pending[:0]
	return dst
}

// DecodeAll returns the text of ids at once: each byte that does not begin
// a valid UTF-8 sequence becomes U+FFFD, as ranging over a Go string does.
func DecodeAll(v Vocabulary, ids []uint32) (string, error) {
	d := NewDetokenizer(v)
	out, err := d.Add(nil, ids)
	if err != nil {
		return "", err
	}
	return string(d.Flush(out)), nil
}

// appendValid appends the decided prefix of b to dst and returns how many
// bytes of b it consumed. Unless final, it stops before an incomplete but
// possibly valid sequence at the end.
func appendValid(dst, b []byte, final bool) ([]byte, int) {
	i := 0
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			dst = append(dst, b[i])
			i++
			continue
		}
		if !final && !utf8.FullRune(b[i:]) {
			break
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, b[i:i+size]...)
		}
		i += size
	}
	return dst, i
}
