// Package jsonscan walks the members of a JSON object as they are written,
// for oaiformat's rewrites of request bodies and chunks and for the
// assembly of non-streaming answers, which copy members byte for byte
// instead of decoding and encoding them again. The reading is
// encoding/json's: its Valid checks the document, and its Decoder finds
// each member, so what Members accepts and how it reads a key are the
// standard library's.
package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrNotObject is the error of a document that is valid JSON but not an
// object.
var ErrNotObject = errors.New("jsonscan: not a JSON object")

// Members walks the members of the JSON object d, which must be one
// object with nothing but white space around it, validating the whole
// document with encoding/json's rules. fn gets each member's key as
// written between its quotes, whether the key needs unquoting (an escape
// or a non-ASCII byte) before it compares equal to a Go string, the member
// itself, from its key's opening quote to the end of its value, and the
// value alone. Members does not retain d; the slices alias it.
func Members(d []byte, fn func(key []byte, quoted bool, member, value []byte)) error {
	if !json.Valid(d) {
		var v any
		if err := json.Unmarshal(d, &v); err != nil {
			return err
		}
		return errors.New("jsonscan: invalid JSON") // Valid and Unmarshal disagree: never seen
	}
	dec := json.NewDecoder(bytes.NewReader(d))
	if tok, err := dec.Token(); err != nil {
		return err
	} else if tok != json.Delim('{') {
		return fmt.Errorf("%w: %v", ErrNotObject, tok)
	}
	for dec.More() {
		// The key's opening quote is the first quote after the last value
		// (or the object's brace) read: only white space and a comma lie
		// between.
		ks := int(dec.InputOffset())
		ks += bytes.IndexByte(d[ks:], '"') + 1
		if _, err := dec.Token(); err != nil {
			return err
		}
		ke := int(dec.InputOffset()) - 1 // the key's closing quote
		var v span
		if err := dec.Decode(&v); err != nil {
			return err
		}
		end := int(dec.InputOffset())
		key := d[ks:ke]
		fn(key, needsUnquote(key), d[ks-1:end], d[end-v.n:end])
	}
	return nil // Valid saw the closing brace and nothing but space after
}

// span takes a value's length from the decoder, which hands it the
// value's bytes as written (without the copy a json.RawMessage makes).
type span struct{ n int }

func (s *span) UnmarshalJSON(b []byte) error {
	s.n = len(b)
	return nil
}

// needsUnquote reports whether a key as written holds an escape or a
// non-ASCII byte, so that it must be unquoted before it is compared.
func needsUnquote(key []byte) bool {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
}
