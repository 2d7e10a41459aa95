// Package jsonscan reads the few fields the worker agent needs out of an
// OpenAI-style streaming chunk (the JSON payload of one SSE "data:" line
// from vLLM, SGLang or any OpenAI-compatible engine).
//
// # Why it exists
//
// The agent relays every chunk an engine sends, one per generated token, and
// for each it needs only the first choice's delta text, its finish reason and
// the usage counts; the raw bytes travel on untouched. encoding/json's
// reflection-driven decoder scans the input twice (once to validate, once to
// decode), looks every key up in a field map and builds a slice of choices,
// per token. [Scan] does the same job in one pass over the bytes, with no
// reflection, skipping (but validating) everything it does not need, and
// allocates only the text it returns. [Members] walks the members of an
// object with the same reader, for oaiformat's rewrites of request bodies
// and chunks, which copy members as they were written.
//
// # Parity contract
//
// Scan behaves exactly like
//
//	var c struct {
//		Choices []struct {
//			Text  string `json:"text"`
//			Delta struct {
//				Content string `json:"content"`
//			} `json:"delta"`
//			FinishReason *string `json:"finish_reason"`
//		} `json:"choices"`
//		Usage *struct {
//			PromptTokens     uint32 `json:"prompt_tokens"`
//			CompletionTokens uint32 `json:"completion_tokens"`
//			TotalTokens      uint32 `json:"total_tokens"`
//		} `json:"usage"`
//	}
//	err := json.Unmarshal(raw, &c)
//
// with encoding/json's default (v1) decoder: it fails if and only if
// Unmarshal fails, and when it succeeds the [Fields] hold what c would. That
// covers encoding/json's quirks as well as its rules:
//
//   - the whole document is validated (the RFC 8259 grammar, at most 10000
//     nested arrays and objects, nothing but white space after the value);
//   - a top-level null is accepted and yields zero Fields;
//   - object keys are unescaped and then matched to field names
//     case-insensitively, with Unicode simple folding (so "CHOICES" and
//     "\u212a" for 'k' both match);
//   - for a duplicate key the last value wins, but objects merge: a second
//     "usage" object, "delta" object, or "choices" array decodes into what
//     the first one left (element 0 of a non-empty choices array is reused,
//     not zeroed), while null resets a slice or pointer ("choices", "usage",
//     "finish_reason") and is a no-op for a string, a number or a struct;
//   - a value of the wrong JSON type for its field (a number for "text", an
//     object for "choices", a non-object element of "choices", a token count
//     that is not an integer in [0, 2^32)) is an error, in any element of
//     "choices", not just the first;
//   - strings are unescaped as encoding/json does, replacing invalid UTF-8
//     and unpaired surrogate escapes with U+FFFD.
//
// FuzzScan in the tests checks the contract against encoding/json itself,
// and FuzzMembers holds Members to encoding/json's reading of an object.
package jsonscan

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Fields is what the agent needs from one chunk.
type Fields struct {
	Choices          int    // the number of elements in "choices"
	Text             string // choices[0].delta.content + choices[0].text, when Choices > 0
	FinishReason     string // choices[0].finish_reason, when HasFinish
	HasFinish        bool   // choices[0].finish_reason is a string (not null or absent)
	HasUsage         bool   // "usage" is an object (not null or absent)
	PromptTokens     uint32 // usage.prompt_tokens
	CompletionTokens uint32 // usage.completion_tokens
	TotalTokens      uint32 // usage.total_tokens
	// Set by ScanSpan only: when TextEnd > TextStart, the text is
	// raw[TextStart:TextEnd] as it stands and Text is empty.
	TextStart, TextEnd int
}

// An Error reports why Scan refused a chunk: a JSON syntax error or a value
// of the wrong type for one of the fields Scan reads.
type Error struct {
	Offset int    // byte offset into the chunk where the problem was found
	Msg    string // what was wrong there
}

func (e *Error) Error() string {
	return "jsonscan: " + e.Msg + " at offset " + strconv.Itoa(e.Offset)
}

// Scan parses one chunk in a single pass, validating the whole document, and
// fills in f. On error f is left zero. Scan does not retain raw; the strings
// in f never alias it.
func Scan(raw []byte, f *Fields) error { return scan(raw, f, false) }

// ScanSpan is Scan, but when choices[0]'s text is a span of raw as it
// stands (one of delta.content and text, with no escape and valid UTF-8:
// what engines send for nearly every token) it makes no string: it
// reports the span in f.TextStart and f.TextEnd and leaves f.Text empty.
// A caller that keeps raw's bytes for as long as it uses the text can
// alias them. Any other text is in f.Text, as Scan makes it.
func ScanSpan(raw []byte, f *Fields) error { return scan(raw, f, true) }

func scan(raw []byte, f *Fields, spans bool) error {
	*f = Fields{}
	var st state
	i := skipSpace(raw, 0)
	if i >= len(raw) {
		return errEOF(raw)
	}
	var err error
	switch raw[i] {
	case '{':
		i, err = st.top(raw, i)
	case 'n':
		i, err = literal(raw, i, "null")
	default:
		// Anything else is either invalid or a type mismatch; both are
		// errors for encoding/json.
		return typeError(raw, i, "top-level value")
	}
	if err != nil {
		return err
	}
	if i = skipSpace(raw, i); i < len(raw) {
		return syntaxError(i, "invalid character "+quoteChar(raw[i])+" after top-level value")
	}
	st.fill(raw, f, spans)
	return nil
}

// Members walks the members of the JSON object d, which must be one
// object with nothing but white space around it, validating the whole
// document with encoding/json's rules. fn gets each member's key as
// written between its quotes, whether the key needs unquoting (an escape
// or a non-ASCII byte) before it compares equal to a Go string, the member
// itself, from its key's opening quote to the end of its value, and the
// value alone. Members does not retain d; the slices alias it.
func Members(d []byte, fn func(key []byte, quoted bool, member, value []byte)) error {
	i := skipSpace(d, 0)
	if i >= len(d) {
		return errEOF(d)
	}
	if d[i] != '{' {
		return typeError(d, i, "top-level object")
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		i++
	} else {
		for {
			ks, ke, fl, j, err := objectKey(d, i)
			if err != nil {
				return err
			}
			end, err := skipValue(d, j, depthTop)
			if err != nil {
				return err
			}
			fn(d[ks:ke], fl != 0, d[ks-1:end], d[j:end])
			var last bool
			if i, last, err = nextMember(d, end); err != nil {
				return err
			}
			if last {
				break
			}
		}
	}
	if i = skipSpace(d, i); i < len(d) {
		return syntaxError(i, "invalid character "+quoteChar(d[i])+" after top-level value")
	}
	return nil
}

// maxDepth is encoding/json's limit on nested arrays and objects.
const maxDepth = 10000

// Nesting depths of the containers Scan walks into; values skipped inside
// them start one deeper.
const (
	depthTop     = 1 // the chunk object
	depthChoices = 2 // the "choices" array; also the "usage" object
	depthChoice  = 3 // an element of "choices"
	depthDelta   = 4 // "delta"
)

// span is a JSON string's contents, between the quotes, in the input.
type span struct {
	start, end int
	flags      uint8 // strEscape, strNonASCII
}

const (
	strEscape   = 1 << iota // has a backslash escape
	strNonASCII             // has a byte >= 0x80 (maybe invalid UTF-8)
)

// choice is the decoded state of one element of "choices".
type choice struct {
	text, content, finish span
	hasFinish             bool
}

// state is the decoded state of the chunk: the engineChunk struct, minus the
// elements of Choices beyond the first, which nobody reads.
type state struct {
	choices                   int
	c0                        choice
	hasUsage                  bool
	prompt, completion, total uint32
}

func (st *state) fill(raw []byte, f *Fields, spans bool) {
	f.Choices = st.choices
	if st.choices > 0 {
		c := &st.c0
		var sp span
		plain := false
		if spans {
			sp, plain = plainSpan(raw, c.content, c.text)
		}
		if plain {
			f.TextStart, f.TextEnd = sp.start, sp.end
		} else {
			f.Text = joinText(raw, c.content, c.text)
		}
		if c.hasFinish {
			f.HasFinish = true
			f.FinishReason = finishString(raw, c.finish)
		}
	}
	if st.hasUsage {
		f.HasUsage = true
		f.PromptTokens, f.CompletionTokens, f.TotalTokens = st.prompt, st.completion, st.total
	}
}

// Object keys, as encoding/json would match them to the struct fields.
const (
	keyOther = iota
	keyChoices
	keyUsage
	keyText
	keyDelta
	keyFinishReason
	keyContent
	keyPromptTokens
	keyCompletionTokens
	keyTotalTokens
)

// top decodes the chunk object starting at d[i] == '{'.
func (st *state) top(d []byte, i int) (int, error) {
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		ks, ke, fl, j, err := objectKey(d, i)
		if err != nil {
			return j, err
		}
		i = j
		switch lookupKey(d[ks:ke], fl, topKeys) {
		case keyChoices:
			i, err = st.choicesValue(d, i)
		case keyUsage:
			i, err = st.usageValue(d, i)
		default:
			i, err = skipValue(d, i, depthTop)
		}
		if err != nil {
			return i, err
		}
		var end bool
		if i, end, err = nextMember(d, i); err != nil || end {
			return i, err
		}
	}
}

// objectKey reads `"key"` `:` and the white space around them, starting at
// d[i], where an object member should begin. It returns the key's contents
// d[ks:ke] with their flags and the index of the member's value.
func objectKey(d []byte, i int) (ks, ke int, fl uint8, j int, err error) {
	if i >= len(d) {
		return 0, 0, 0, i, errEOF(d)
	}
	if d[i] != '"' {
		return 0, 0, 0, i, syntaxError(i, "invalid character "+quoteChar(d[i])+" looking for beginning of object key string")
	}
	ks = i + 1
	j, fl, err = scanString(d, ks)
	if err != nil {
		return 0, 0, 0, j, err
	}
	ke = j - 1
	j = skipSpace(d, j)
	if j >= len(d) {
		return 0, 0, 0, j, errEOF(d)
	}
	if d[j] != ':' {
		return 0, 0, 0, j, syntaxError(j, "invalid character "+quoteChar(d[j])+" after object key")
	}
	j = skipSpace(d, j+1)
	if j >= len(d) {
		return 0, 0, 0, j, errEOF(d)
	}
	return ks, ke, fl, j, nil
}

// nextMember reads what follows an object member's value at d[i]: a comma,
// returning the index of the next key, or the closing brace, returning the
// index after it and end.
func nextMember(d []byte, i int) (next int, end bool, err error) {
	i = skipSpace(d, i)
	if i >= len(d) {
		return i, false, errEOF(d)
	}
	switch d[i] {
	case ',':
		return skipSpace(d, i+1), false, nil
	case '}':
		return i + 1, true, nil
	}
	return i, false, syntaxError(i, "invalid character "+quoteChar(d[i])+" after object key:value pair")
}

// nextElement is nextMember for arrays.
func nextElement(d []byte, i int) (next int, end bool, err error) {
	i = skipSpace(d, i)
	if i >= len(d) {
		return i, false, errEOF(d)
	}
	switch d[i] {
	case ',':
		return skipSpace(d, i+1), false, nil
	case ']':
		return i + 1, true, nil
	}
	return i, false, syntaxError(i, "invalid character "+quoteChar(d[i])+" after array element")
}

// choicesValue decodes the value of "choices" at d[i].
func (st *state) choicesValue(d []byte, i int) (int, error) {
	switch d[i] {
	case 'n': // a nil slice
		st.choices, st.c0 = 0, choice{}
		return literal(d, i, "null")
	case '[':
	default:
		return i, typeError(d, i, "choices")
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == ']' {
		// encoding/json replaces the slice with a new empty one.
		st.choices, st.c0 = 0, choice{}
		return i + 1, nil
	}
	// Element 0 decodes into whatever an earlier "choices" left there, as
	// encoding/json reuses the slice's backing array; the other elements
	// are only type-checked.
	var rest choice
	n := 0
	for {
		if i >= len(d) {
			return i, errEOF(d)
		}
		c := &rest
		if n == 0 {
			c = &st.c0
		}
		var err error
		if i, err = choiceValue(d, i, c); err != nil {
			return i, err
		}
		n++
		var end bool
		if i, end, err = nextElement(d, i); err != nil || end {
			st.choices = n
			return i, err
		}
	}
}

// choiceValue decodes an element of "choices" at d[i] into c.
func choiceValue(d []byte, i int, c *choice) (int, error) {
	switch d[i] {
	case 'n': // null leaves a struct as it is
		return literal(d, i, "null")
	case '{':
	default:
		return i, typeError(d, i, "choices element")
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		ks, ke, fl, j, err := objectKey(d, i)
		if err != nil {
			return j, err
		}
		i = j
		switch lookupKey(d[ks:ke], fl, choiceKeys) {
		case keyText:
			i, err = stringValue(d, i, &c.text, "text")
		case keyDelta:
			i, err = deltaValue(d, i, c)
		case keyFinishReason:
			switch d[i] {
			case 'n': // a nil pointer
				c.hasFinish, c.finish = false, span{}
				i, err = literal(d, i, "null")
			default:
				c.hasFinish = true
				i, err = stringValue(d, i, &c.finish, "finish_reason")
			}
		default:
			i, err = skipValue(d, i, depthChoice)
		}
		if err != nil {
			return i, err
		}
		var end bool
		if i, end, err = nextMember(d, i); err != nil || end {
			return i, err
		}
	}
}

// deltaValue decodes the value of "delta" at d[i] into c.
func deltaValue(d []byte, i int, c *choice) (int, error) {
	switch d[i] {
	case 'n':
		return literal(d, i, "null")
	case '{':
	default:
		return i, typeError(d, i, "delta")
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		ks, ke, fl, j, err := objectKey(d, i)
		if err != nil {
			return j, err
		}
		i = j
		if lookupKey(d[ks:ke], fl, deltaKeys) == keyContent {
			i, err = stringValue(d, i, &c.content, "content")
		} else {
			i, err = skipValue(d, i, depthDelta)
		}
		if err != nil {
			return i, err
		}
		var end bool
		if i, end, err = nextMember(d, i); err != nil || end {
			return i, err
		}
	}
}

// usageValue decodes the value of "usage" at d[i].
func (st *state) usageValue(d []byte, i int) (int, error) {
	switch d[i] {
	case 'n': // a nil pointer
		st.hasUsage, st.prompt, st.completion, st.total = false, 0, 0, 0
		return literal(d, i, "null")
	case '{':
	default:
		return i, typeError(d, i, "usage")
	}
	if !st.hasUsage { // a new struct; otherwise decode into the old one
		st.hasUsage, st.prompt, st.completion, st.total = true, 0, 0, 0
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		ks, ke, fl, j, err := objectKey(d, i)
		if err != nil {
			return j, err
		}
		i = j
		switch lookupKey(d[ks:ke], fl, usageKeys) {
		case keyPromptTokens:
			i, err = uint32Value(d, i, &st.prompt)
		case keyCompletionTokens:
			i, err = uint32Value(d, i, &st.completion)
		case keyTotalTokens:
			i, err = uint32Value(d, i, &st.total)
		default:
			i, err = skipValue(d, i, depthChoices)
		}
		if err != nil {
			return i, err
		}
		var end bool
		if i, end, err = nextMember(d, i); err != nil || end {
			return i, err
		}
	}
}

// stringValue decodes a string field's value at d[i] into *s; null leaves
// *s as it is.
func stringValue(d []byte, i int, s *span, field string) (int, error) {
	switch d[i] {
	case '"':
		j, fl, err := scanString(d, i+1)
		if err != nil {
			return j, err
		}
		*s = span{i + 1, j - 1, fl}
		return j, nil
	case 'n':
		return literal(d, i, "null")
	}
	return i, typeError(d, i, field)
}

// uint32Value decodes a uint32 field's value at d[i] into *n; null leaves *n
// as it is. Like encoding/json it accepts exactly the number literals
// strconv.ParseUint(lit, 10, 32) does: digits only, at most 2^32-1.
func uint32Value(d []byte, i int, n *uint32) (int, error) {
	if d[i] == 'n' {
		return literal(d, i, "null")
	}
	var v uint64
	j := i
	for ; j < len(d) && '0' <= d[j] && d[j] <= '9'; j++ {
		v = v*10 + uint64(d[j]-'0')
		if v > 1<<32-1 {
			return j, typeError(d, i, "token count (out of range)")
		}
	}
	if j == i || j < len(d) && (d[j] == '.' || d[j] == 'e' || d[j] == 'E') {
		return i, typeError(d, i, "token count")
	}
	// A leading zero followed by more digits ("01") is invalid JSON.
	if d[i] == '0' && j > i+1 {
		return i + 1, syntaxError(i+1, "invalid character "+quoteChar(d[i+1])+" after object key:value pair")
	}
	*n = uint32(v)
	return j, nil
}

// skipValue validates the JSON value at d[i] and returns the index after it.
// depth is the number of arrays and objects the value is nested in.
func skipValue(d []byte, i int, depth int) (int, error) {
	switch c := d[i]; c {
	case '"':
		j, _, err := scanString(d, i+1)
		return j, err
	case '{':
		if depth >= maxDepth {
			return i, syntaxError(i, "invalid character '{' exceeded max depth")
		}
		return skipObject(d, i, depth+1)
	case '[':
		if depth >= maxDepth {
			return i, syntaxError(i, "invalid character '[' exceeded max depth")
		}
		return skipArray(d, i, depth+1)
	case 'n':
		return literal(d, i, "null")
	case 't':
		return literal(d, i, "true")
	case 'f':
		return literal(d, i, "false")
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return skipNumber(d, i)
	default:
		return i, syntaxError(i, "invalid character "+quoteChar(c)+" looking for beginning of value")
	}
}

// skipObject validates the object at d[i] == '{', which is at depth depth.
func skipObject(d []byte, i int, depth int) (int, error) {
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		_, _, _, j, err := objectKey(d, i)
		if err != nil {
			return j, err
		}
		if i, err = skipValue(d, j, depth); err != nil {
			return i, err
		}
		var end bool
		if i, end, err = nextMember(d, i); err != nil || end {
			return i, err
		}
	}
}

// skipArray validates the array at d[i] == '[', which is at depth depth.
func skipArray(d []byte, i int, depth int) (int, error) {
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == ']' {
		return i + 1, nil
	}
	for {
		if i >= len(d) {
			return i, errEOF(d)
		}
		var err error
		if i, err = skipValue(d, i, depth); err != nil {
			return i, err
		}
		var end bool
		if i, end, err = nextElement(d, i); err != nil || end {
			return i, err
		}
	}
}

// skipNumber validates the number literal at d[i].
func skipNumber(d []byte, i int) (int, error) {
	if d[i] == '-' {
		i++
		if i >= len(d) {
			return i, errEOF(d)
		}
	}
	switch c := d[i]; {
	case c == '0':
		i++
	case '1' <= c && c <= '9':
		i++
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
	default:
		return i, syntaxError(i, "invalid character "+quoteChar(c)+" in numeric literal")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) {
			return i, errEOF(d)
		}
		if d[i] < '0' || d[i] > '9' {
			return i, syntaxError(i, "invalid character "+quoteChar(d[i])+" after decimal point in numeric literal")
		}
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) {
			return i, errEOF(d)
		}
		if d[i] < '0' || d[i] > '9' {
			return i, syntaxError(i, "invalid character "+quoteChar(d[i])+" in exponent of numeric literal")
		}
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
	}
	return i, nil
}

// literal checks that d[i:] starts with lit (true, false or null).
func literal(d []byte, i int, lit string) (int, error) {
	if len(d)-i >= len(lit) && string(d[i:i+len(lit)]) == lit {
		return i + len(lit), nil
	}
	for k := 1; k < len(lit); k++ {
		if i+k >= len(d) {
			return i + k, errEOF(d)
		}
		if d[i+k] != lit[k] {
			return i + k, syntaxError(i+k, "invalid character "+quoteChar(d[i+k])+" in literal "+lit)
		}
	}
	panic("unreachable")
}

// skipSpace returns the index of the first non-space byte at or after d[i].
func skipSpace(d []byte, i int) int {
	for i < len(d) && d[i] <= ' ' && (d[i] == ' ' || d[i] == '\n' || d[i] == '\r' || d[i] == '\t') {
		i++
	}
	return i
}

// scanString validates the string whose contents start at d[i] (just after
// the opening quote) and returns the index after the closing quote, with
// flags saying whether the contents need unquoting.
func scanString(d []byte, i int) (int, uint8, error) {
	var fl uint8
	for {
		// Eight bytes at a time while none is special: '"', '\\', a
		// control character or a byte >= 0x80. The lowest flagged byte
		// is always a real hit (borrows only propagate upwards).
		for i+8 <= len(d) {
			x := binary.LittleEndian.Uint64(d[i:])
			m := ((x - lsb*0x20) | (x ^ lsb*'"' - lsb) | (x ^ lsb*'\\' - lsb) | x) & (lsb * 0x80)
			if m != 0 {
				i += bits.TrailingZeros64(m) / 8
				break
			}
			i += 8
		}
		if i >= len(d) {
			return i, fl, errEOF(d)
		}
		switch c := d[i]; {
		case c == '"':
			return i + 1, fl, nil
		case c == '\\':
			fl |= strEscape
			if i+1 >= len(d) {
				return i + 1, fl, errEOF(d)
			}
			switch d[i+1] {
			case 'b', 'f', 'n', 'r', 't', '\\', '/', '"':
				i += 2
			case 'u':
				for k := i + 2; k < i+6; k++ {
					if k >= len(d) {
						return k, fl, errEOF(d)
					}
					if !isHex(d[k]) {
						return k, fl, syntaxError(k, "invalid character "+quoteChar(d[k])+" in \\u hexadecimal character escape")
					}
				}
				i += 6
			default:
				return i + 1, fl, syntaxError(i+1, "invalid character "+quoteChar(d[i+1])+" in string escape code")
			}
		case c < 0x20:
			return i, fl, syntaxError(i, "invalid character "+quoteChar(c)+" in string literal")
		case c >= utf8.RuneSelf:
			fl |= strNonASCII
			i++
		default:
			i++
		}
	}
}

// lsb has the low bit of each byte set.
const lsb = 0x0101010101010101

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// needsUnquote reports whether a string's contents differ from its raw bytes.
func needsUnquote(s []byte, fl uint8) bool {
	return fl&strEscape != 0 || fl&strNonASCII != 0 && !utf8.Valid(s)
}

// joinText returns the unquoted contents of a followed by those of b, in one
// allocation (none when both are empty).
func joinText(d []byte, a, b span) string {
	as, bs := d[a.start:a.end], d[b.start:b.end]
	if len(as)+len(bs) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.Grow(len(as) + len(bs))
	appendUnquoted(&sb, as, a.flags)
	appendUnquoted(&sb, bs, b.flags)
	return sb.String()
}

// plainSpan reports the one non-empty span of a and b when its contents
// are its text as they stand (no escape, valid UTF-8).
func plainSpan(d []byte, a, b span) (span, bool) {
	switch {
	case a.end > a.start && b.end > b.start:
		return span{}, false
	case b.end > b.start:
		a = b
	case a.end == a.start:
		return span{}, false
	}
	return a, !needsUnquote(d[a.start:a.end], a.flags)
}

// appendUnquoted writes the unquoted form of a JSON string's contents s.
func appendUnquoted(sb *strings.Builder, s []byte, fl uint8) {
	if !needsUnquote(s, fl) {
		sb.Write(s)
		return
	}
	for r := 0; r < len(s); {
		start := r
		for r < len(s) && s[r] != '\\' && s[r] < utf8.RuneSelf {
			r++
		}
		sb.Write(s[start:r])
		if r == len(s) {
			return
		}
		var rr rune
		rr, r = unquoteRune(s, r)
		sb.WriteRune(rr)
	}
}

// finishString returns the unquoted finish reason, without allocating for
// the values engines send.
func finishString(d []byte, s span) string {
	b := d[s.start:s.end]
	if s.flags != 0 {
		var sb strings.Builder
		appendUnquoted(&sb, b, s.flags)
		return sb.String()
	}
	switch string(b) {
	case "stop":
		return "stop"
	case "length":
		return "length"
	case "tool_calls":
		return "tool_calls"
	case "abort":
		return "abort"
	case "content_filter":
		return "content_filter"
	case "function_call":
		return "function_call"
	case "error":
		return "error"
	}
	return string(b)
}

// unquoteRune decodes the rune at s[r] of a validated JSON string's
// contents, returning it and the index after it, exactly as encoding/json's
// unquote does: escapes are decoded, a \u surrogate escape not followed by
// its pair becomes U+FFFD (and the next escape is decoded on its own), and
// each byte of invalid UTF-8 becomes U+FFFD.
func unquoteRune(s []byte, r int) (rune, int) {
	c := s[r]
	if c < utf8.RuneSelf {
		if c != '\\' {
			return rune(c), r + 1
		}
		switch e := s[r+1]; e {
		case 'b':
			return '\b', r + 2
		case 'f':
			return '\f', r + 2
		case 'n':
			return '\n', r + 2
		case 'r':
			return '\r', r + 2
		case 't':
			return '\t', r + 2
		case 'u':
			rr := getu4(s[r:])
			r += 6
			if utf16.IsSurrogate(rr) {
				if dec := utf16.DecodeRune(rr, getu4(s[r:])); dec != unicode.ReplacementChar {
					return dec, r + 6
				}
				return unicode.ReplacementChar, r
			}
			return rr, r
		default: // '"', '\\', '/'
			return rune(e), r + 2
		}
	}
	rr, size := utf8.DecodeRune(s[r:])
	return rr, r + size
}

// getu4 decodes \uXXXX at the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// keyName maps a field name to the key the scanner switches on.
type keyName struct {
	name string
	key  int
}

var (
	topKeys    = []keyName{{"choices", keyChoices}, {"usage", keyUsage}}
	choiceKeys = []keyName{{"text", keyText}, {"delta", keyDelta}, {"finish_reason", keyFinishReason}}
	usageKeys  = []keyName{{"prompt_tokens", keyPromptTokens}, {"completion_tokens", keyCompletionTokens}, {"total_tokens", keyTotalTokens}}
	deltaKeys  = []keyName{{"content", keyContent}}
)

// lookupKey returns the key of the field k names among names (compared as
// encoding/json does), or keyOther. fl marks a key that needs folding.
func lookupKey(k []byte, fl uint8, names []keyName) int {
	if fl != 0 {
		var buf [maxKey]byte
		k = foldKey(k, &buf)
	}
	for _, n := range names {
		if foldEq(k, n.name) {
			return n.key
		}
	}
	return keyOther
}

// foldEq reports whether the ASCII key k equals the lower-case ASCII name
// ignoring ASCII case, which is how encoding/json's foldName compares them.
func foldEq(k []byte, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c != name[i] && ('A' > c || c > 'Z' || c+('a'-'A') != name[i]) {
			return false
		}
	}
	return true
}

// maxKey bounds the folded length of a key that can match a field name (the
// longest is "completion_tokens").
const maxKey = 24

// foldKey unquotes a key that has escapes or non-ASCII bytes and folds each
// rune as encoding/json's foldName does, keeping only what can match an
// ASCII field name: a rune whose fold is ASCII (such as U+212A KELVIN SIGN,
// which folds to 'K') becomes that byte, any other becomes 0x80, which
// matches nothing. It returns nil when the key is too long to match.
func foldKey(k []byte, buf *[maxKey]byte) []byte {
	n := 0
	for r := 0; r < len(k); {
		if n == len(buf) {
			return nil
		}
		var rr rune
		rr, r = unquoteRune(k, r)
		if rr >= utf8.RuneSelf {
			rr = foldRune(rr)
		}
		if rr >= utf8.RuneSelf {
			rr = utf8.RuneSelf
		}
		buf[n] = byte(rr)
		n++
	}
	return buf[:n]
}

// foldRune returns the smallest rune in r's case-folding orbit, as
// encoding/json's foldRune does.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

func errEOF(d []byte) error {
	return &Error{Offset: len(d), Msg: "unexpected end of JSON input"}
}

func syntaxError(i int, msg string) error {
	return &Error{Offset: i, Msg: msg}
}

// typeError reports a value at d[i] of the wrong type for field. (If the
// value is not even valid JSON, encoding/json would report a syntax error
// instead; either way the chunk is refused.)
func typeError(d []byte, i int, field string) error {
	var what string
	switch c := d[i]; {
	case c == '"':
		what = "string"
	case c == '{':
		what = "object"
	case c == '[':
		what = "array"
	case c == 't' || c == 'f':
		what = "bool"
	case c == 'n':
		what = "null"
	case c == '-' || '0' <= c && c <= '9':
		what = "number"
	default:
		return syntaxError(i, "invalid character "+quoteChar(c)+" looking for beginning of value")
	}
	return &Error{Offset: i, Msg: "cannot decode " + what + " into " + field}
}

// quoteChar formats c for an error message.
func quoteChar(c byte) string {
	if c == '\'' {
		return `'\''`
	}
	if c == '"' {
		return `'"'`
	}
	s := strconv.Quote(string(c))
	return "'" + s[1:len(s)-1] + "'"
}
