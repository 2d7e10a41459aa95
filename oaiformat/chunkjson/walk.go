package chunkjson

import (
	"strings"
	"unicode/utf8"
)

// The functions below expose Scan's reader, for a caller that walks a
// document of another shape in one pass (oaiformat.Read reads a request
// body with them). Each takes the document d and the index i where its
// part starts, validates that part with encoding/json's rules, and returns
// the index after it; an error is an *Error, with its offset. The caller
// walks objects as
//
//	i, empty, err := Open(d, i) // d[i] == '{'
//	for !empty {
//		key, quoted, v, err := Key(d, i)
//		... read or skip the value at d[v], to i
//		i, empty, err = NextMember(d, i)
//	}
//
// and arrays alike with NextElement. SkipValue, String, Number and Literal
// read the byte at d[i]: the index of a value that Key returns, and that
// of a member or element that Open or NextElement return without an error
// and not empty or end, is always within d.

// SkipSpace returns the index of the first byte at or after d[i] that is
// not JSON white space.
func SkipSpace(d []byte, i int) int { return skipSpace(d, i) }

// Open reads the '{' or '[' at d[i] and the white space after it. It
// returns the index of the first member or element or, for an empty
// object or array, the index after its end and empty.
func Open(d []byte, i int) (next int, empty bool, err error) {
	closer := byte('}')
	if d[i] == '[' {
		closer = ']'
	}
	i = skipSpace(d, i+1)
	if i >= len(d) {
		return i, false, errEOF(d)
	}
	if d[i] == closer {
		return i + 1, true, nil
	}
	return i, false, nil
}

// Key reads an object member's key, its colon and the white space around
// them, from d[i], where the member should begin. It returns the key as
// written between its quotes, whether it needs unquoting (an escape or a
// non-ASCII byte) before it compares equal to a Go string, and the index
// of the member's value.
func Key(d []byte, i int) (key []byte, quoted bool, value int, err error) {
	ks, ke, fl, j, err := objectKey(d, i)
	if err != nil {
		return nil, false, j, err
	}
	return d[ks:ke], fl != 0, j, nil
}

// NextMember reads what follows an object member's value, from d[i]: a
// comma, returning the index of the next member, or the closing brace,
// returning the index after it and end.
func NextMember(d []byte, i int) (next int, end bool, err error) { return nextMember(d, i) }

// NextElement is NextMember for arrays.
func NextElement(d []byte, i int) (next int, end bool, err error) {
	i, end, err = nextElement(d, i)
	if err == nil && !end && i >= len(d) {
		return i, false, errEOF(d)
	}
	return i, end, err
}

// SkipValue validates the JSON value at d[i]. depth is the number of
// arrays and objects it is nested in (1 for a member of the top-level
// object), for encoding/json's limit of 10000.
func SkipValue(d []byte, i, depth int) (int, error) { return skipValue(d, i, depth) }

// String reads the string at d[i] == '"'. It returns its contents as
// written between the quotes and whether they need unquoting ([Unquote])
// to read as a Go string.
func String(d []byte, i int) (s []byte, quoted bool, next int, err error) {
	j, fl, err := scanString(d, i+1)
	if err != nil {
		return nil, false, j, err
	}
	return d[i+1 : j-1], fl != 0, j, nil
}

// Number validates the number literal at d[i], which starts with '-' or a
// digit; d[i:next] is the literal.
func Number(d []byte, i int) (next int, err error) { return skipNumber(d, i) }

// Literal reads lit (true, false or null), whose first byte is at d[i].
func Literal(d []byte, i int, lit string) (int, error) { return literal(d, i, lit) }

// Unquote returns the contents s of a valid JSON string as encoding/json
// decodes them: escapes decoded, and U+FFFD for invalid UTF-8 and for an
// unpaired surrogate escape.
func Unquote(s []byte) string {
	var sb strings.Builder
	sb.Grow(len(s))
	appendUnquoted(&sb, s, strEscape|strNonASCII)
	return sb.String()
}

// AppendUnquoted appends the decoded contents s of a valid JSON string
// (as Unquote returns them) to dst.
func AppendUnquoted(dst, s []byte) []byte {
	for r := 0; r < len(s); {
		start := r
		for r < len(s) && s[r] != '\\' && s[r] < utf8.RuneSelf {
			r++
		}
		dst = append(dst, s[start:r]...)
		if r == len(s) {
			break
		}
		var rr rune
		rr, r = unquoteRune(s, r)
		dst = utf8.AppendRune(dst, rr)
	}
	return dst
}
