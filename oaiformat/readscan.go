package oaiformat

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/switchyard-ai/switchyard/oaiformat/chunkjson"
)

// readFields is what Read's scan finds in a request body: the members the
// format checks, each as encoding/json decoded it into the struct Read
// used before (readReference in the tests keeps that decode, and FuzzRead
// holds the scan to it).
//
// The scan validates the whole body with encoding/json's rules and reads
// the members with its semantics: null leaves a member absent (a pointer
// field set to nil); a number for an integer member must read as an int64
// (1.0, 1e2 and 2^63 are refused, as strconv.ParseInt refuses them) and
// one for a float member as a finite float64; a value of the wrong type is
// an invalid_type refusal naming the member as encoding/json's
// UnmarshalTypeError.Field does ("max_tokens", "messages.role"); the first
// such value in the body wins, and a syntax error anywhere in the JSON
// value wins over it, as data after the value loses to it.
//
// Duplicate members: the last one wins, as with encoding/json and
// Python's json. For the two members that are objects or arrays of
// objects this follows encoding/json into its detail: a second
// stream_options object decodes into what the first left (its
// include_usage stays unless the second sets it), and each element of a
// second messages array decodes into the element at its index that an
// earlier messages array left (even past the last array's length, as
// encoding/json reuses the slice's backing array), so that a role or
// content the new element lacks is kept; null resets either member, and
// an empty messages array also forgets what earlier ones left.
//
// One deliberate difference from encoding/json: member names match
// exactly (after unescaping), not case-insensitively. encoding/json reads
// "MODEL" or "Max_Tokens" as the model and max_tokens; engines such as
// vLLM and SGLang (Python's json, pydantic) ignore such members, and the
// broker must read a body as they will.
type readFields struct {
	set         uint8  // which of the scalar members below are present
	handoff     uint8  // bit i: HandoffFields[i] is present
	model       []byte // its contents, between the quotes
	modelQuoted bool   // model needs chunkjson.Unquote
	stream      bool
	include     bool // stream_options.include_usage
	maxTokens   int64
	maxCompl    int64 // max_completion_tokens
	n           int64
	temperature float64
	topP        float64
	messages    []message
	// The members kept as written (nil: absent; "null" when null).
	prompt, stop, tools, functions []byte
}

// The bits of readFields.set.
const (
	hasModel = 1 << iota
	hasStream
	hasInclude
	hasMaxTokens
	hasMaxCompl
	hasN
	hasTemperature
	hasTopP
)

// The members of the request object that Read reads.
const (
	memberOther = iota
	memberModel
	memberStream
	memberStreamOptions
	memberMaxTokens
	memberMaxCompl
	memberN
	memberMessages
	memberPrompt
	memberStop
	memberTemperature
	memberTopP
	memberTools
	memberFunctions
	memberHandoff // + the index in HandoffFields
)

func requestMember(name []byte) int {
	switch string(name) {
	case "model":
		return memberModel
	case "stream":
		return memberStream
	case "stream_options":
		return memberStreamOptions
	case "max_tokens":
		return memberMaxTokens
	case "max_completion_tokens":
		return memberMaxCompl
	case "n":
		return memberN
	case "messages":
		return memberMessages
	case "prompt":
		return memberPrompt
	case "stop":
		return memberStop
	case "temperature":
		return memberTemperature
	case "top_p":
		return memberTopP
	case "tools":
		return memberTools
	case "functions":
		return memberFunctions
	}
	for i, f := range HandoffFields {
		if string(name) == f {
			return memberHandoff + i
		}
	}
	return memberOther
}

// maxName bounds the length of a member name Read can match (the longest
// is "disagg_prefill_dp_rank").
const maxName = 24

// memberName returns the name of a member as its key spells it: the key
// itself, or when it has escapes, the key unescaped into buf (nil when it
// is too long to match a name).
func memberName(key []byte, quoted bool, buf *[maxName]byte) []byte {
	if !quoted {
		return key
	}
	// Each byte of a name takes at most 6 of the key (\u0061).
	if len(key) > 6*maxName {
		return nil
	}
	k := chunkjson.AppendUnquoted(buf[:0], key)
	if len(k) > maxName {
		return nil
	}
	return k
}

// readScan reads a request body into f.
type readScan struct {
	d        []byte
	f        readFields
	mismatch *Error // the first value of the wrong type
}

// scan reads the body s.d. An error is an invalid_json or invalid_type
// *Error.
func (s *readScan) scan() *Error {
	d := s.d
	i := chunkjson.SkipSpace(d, 0)
	if i >= len(d) {
		return notJSON(fmt.Sprintf("unexpected end of JSON input at offset %d", len(d)))
	}
	var err error
	switch d[i] {
	case '{':
		i, err = s.object(i)
	case 'n': // a null body decodes to no members at all
		i, err = chunkjson.Literal(d, i, "null")
	default:
		i, err = s.wrongType(i, 0, "", "object")
	}
	if err != nil {
		var e *chunkjson.Error
		if errors.As(err, &e) {
			return notJSON(fmt.Sprintf("%s at offset %d", e.Msg, e.Offset))
		}
		return notJSON(err.Error())
	}
	if s.mismatch != nil {
		return s.mismatch
	}
	if i = chunkjson.SkipSpace(d, i); i < len(d) {
		return invalid(fmt.Sprintf("request body has data after the JSON object, at offset %d", i), "", "invalid_json")
	}
	return nil
}

func notJSON(what string) *Error {
	return invalid("request body is not valid JSON: "+what, "", "invalid_json")
}

// wrongType records the value at d[i] as one of the wrong type for param,
// which expects want, and skips it; depth is the value's, as for
// chunkjson.SkipValue.
func (s *readScan) wrongType(i, depth int, param, want string) (int, error) {
	j, err := chunkjson.SkipValue(s.d, i, depth)
	if err == nil {
		s.wrongTypeGot(param, want, jsonKind(s.d[i]))
	}
	return j, err
}

func (s *readScan) wrongTypeGot(param, want, got string) {
	if s.mismatch != nil {
		return
	}
	where := param
	if where == "" {
		where = "request body"
	}
	s.mismatch = invalid(fmt.Sprintf("%s: expected %s, got JSON %s", where, want, got), param, "invalid_type")
}

// jsonKind names the kind of the valid JSON value that starts with c, as
// encoding/json's UnmarshalTypeError.Value does.
func jsonKind(c byte) string {
	switch c {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// object reads the request object at d[i] == '{'.
func (s *readScan) object(i int) (int, error) {
	d, f := s.d, &s.f
	i, end, err := chunkjson.Open(d, i)
	var buf [maxName]byte
	for ; !end && err == nil; i, end, err = chunkjson.NextMember(d, i) {
		var key []byte
		var quoted bool
		var v int
		if key, quoted, v, err = chunkjson.Key(d, i); err != nil {
			return v, err
		}
		switch m := requestMember(memberName(key, quoted, &buf)); m {
		case memberModel:
			i, err = s.model(v)
		case memberStream:
			i, err = s.boolean(v, 1, "stream", &f.stream, hasStream)
		case memberStreamOptions:
			i, err = s.streamOptions(v)
		case memberMaxTokens:
			i, err = s.integer(v, "max_tokens", &f.maxTokens, hasMaxTokens)
		case memberMaxCompl:
			i, err = s.integer(v, "max_completion_tokens", &f.maxCompl, hasMaxCompl)
		case memberN:
			i, err = s.integer(v, "n", &f.n, hasN)
		case memberMessages:
			i, err = s.messages(v)
		case memberPrompt:
			i, err = s.raw(v, &f.prompt)
		case memberStop:
			i, err = s.raw(v, &f.stop)
		case memberTemperature:
			i, err = s.float(v, "temperature", &f.temperature, hasTemperature)
		case memberTopP:
			i, err = s.float(v, "top_p", &f.topP, hasTopP)
		case memberTools:
			i, err = s.raw(v, &f.tools)
		case memberFunctions:
			i, err = s.raw(v, &f.functions)
		case memberOther:
			i, err = chunkjson.SkipValue(d, v, 1)
		default:
			// A hand-off field is refused whatever its value, null too.
			f.handoff |= 1 << (m - memberHandoff)
			i, err = chunkjson.SkipValue(d, v, 1)
		}
		if err != nil {
			return i, err
		}
	}
	return i, err
}

// model reads the value of "model" at d[i].
func (s *readScan) model(i int) (int, error) {
	d, f := s.d, &s.f
	switch d[i] {
	case '"':
		v, quoted, j, err := chunkjson.String(d, i)
		if err == nil {
			f.model, f.modelQuoted = v, quoted
			f.set |= hasModel
		}
		return j, err
	case 'n':
		f.set &^= hasModel
		return chunkjson.Literal(d, i, "null")
	}
	return s.wrongType(i, 1, "model", "string")
}

// boolean reads a bool member's value at d[i] into *v and the bit has of
// f.set; depth is the value's.
func (s *readScan) boolean(i, depth int, param string, v *bool, has uint8) (int, error) {
	d, f := s.d, &s.f
	switch d[i] {
	case 't':
		*v = true
		f.set |= has
		return chunkjson.Literal(d, i, "true")
	case 'f':
		*v = false
		f.set |= has
		return chunkjson.Literal(d, i, "false")
	case 'n':
		f.set &^= has
		return chunkjson.Literal(d, i, "null")
	}
	return s.wrongType(i, depth, param, "bool")
}

// integer reads an int64 member's value at d[i] into *v and the bit has of
// f.set: a number literal that strconv.ParseInt reads, as encoding/json
// decodes into an int64.
func (s *readScan) integer(i int, param string, v *int64, has uint8) (int, error) {
	d, f := s.d, &s.f
	switch c := d[i]; {
	case c == 'n':
		f.set &^= has
		return chunkjson.Literal(d, i, "null")
	case c == '-' || '0' <= c && c <= '9':
		j, err := chunkjson.Number(d, i)
		if err != nil {
			return j, err
		}
		n, perr := strconv.ParseInt(string(d[i:j]), 10, 64)
		if perr != nil {
			s.wrongTypeGot(param, "int64", "number "+string(d[i:j]))
			return j, nil
		}
		*v = n
		f.set |= has
		return j, nil
	}
	return s.wrongType(i, 1, param, "int64")
}

// float is integer for a float64 member: a number literal that
// strconv.ParseFloat reads without a range error.
func (s *readScan) float(i int, param string, v *float64, has uint8) (int, error) {
	d, f := s.d, &s.f
	switch c := d[i]; {
	case c == 'n':
		f.set &^= has
		return chunkjson.Literal(d, i, "null")
	case c == '-' || '0' <= c && c <= '9':
		j, err := chunkjson.Number(d, i)
		if err != nil {
			return j, err
		}
		x, perr := strconv.ParseFloat(string(d[i:j]), 64)
		if perr != nil {
			s.wrongTypeGot(param, "float64", "number "+string(d[i:j]))
			return j, nil
		}
		*v = x
		f.set |= has
		return j, nil
	}
	return s.wrongType(i, 1, param, "float64")
}

// raw reads a member kept as written (any JSON value) at d[i] into *v.
func (s *readScan) raw(i int, v *[]byte) (int, error) {
	j, err := chunkjson.SkipValue(s.d, i, 1)
	if err == nil {
		*v = s.d[i:j]
	}
	return j, err
}

// streamOptions reads the value of "stream_options" at d[i]. An object
// decodes into what an earlier one left: only null unsets include_usage.
func (s *readScan) streamOptions(i int) (int, error) {
	d, f := s.d, &s.f
	switch d[i] {
	case 'n':
		f.set &^= hasInclude
		return chunkjson.Literal(d, i, "null")
	case '{':
	default:
		return s.wrongType(i, 1, "stream_options", "object")
	}
	i, end, err := chunkjson.Open(d, i)
	var buf [maxName]byte
	for ; !end && err == nil; i, end, err = chunkjson.NextMember(d, i) {
		var key []byte
		var quoted bool
		var v int
		if key, quoted, v, err = chunkjson.Key(d, i); err != nil {
			return v, err
		}
		if string(memberName(key, quoted, &buf)) == "include_usage" {
			i, err = s.boolean(v, 2, "stream_options.include_usage", &f.include, hasInclude)
		} else {
			i, err = chunkjson.SkipValue(d, v, 2)
		}
		if err != nil {
			return i, err
		}
	}
	return i, err
}

// messages reads the value of "messages" at d[i].
func (s *readScan) messages(i int) (int, error) {
	d, f := s.d, &s.f
	switch d[i] {
	case 'n':
		f.messages = nil
		return chunkjson.Literal(d, i, "null")
	case '[':
	default:
		return s.wrongType(i, 1, "messages", "array")
	}
	i, end, err := chunkjson.Open(d, i)
	if err != nil {
		return i, err
	}
	if end {
		// encoding/json sets a new empty slice: what earlier arrays left
		// is gone.
		f.messages = []message{}
		return i, nil
	}
	// Element n decodes into the element an earlier messages array left
	// at index n, as encoding/json reuses the slice's backing array, up
	// to its capacity (beyond what earlier arrays wrote, elements are
	// zero).
	msgs := f.messages[:0]
	if cap(msgs) == 0 {
		msgs = make([]message, 0, 4) // most chats, in one allocation
	}
	for n := 0; ; n++ {
		if n < cap(msgs) {
			msgs = msgs[:n+1]
		} else {
			msgs = append(msgs, message{})
		}
		if i, err = s.message(i, &msgs[n]); err == nil {
			i, end, err = chunkjson.NextElement(d, i)
		}
		if err != nil || end {
			f.messages = msgs
			return i, err
		}
	}
}

// message reads an element of "messages" at d[i] into m.
func (s *readScan) message(i int, m *message) (int, error) {
	d := s.d
	switch d[i] {
	case 'n': // null leaves a struct as it is
		return chunkjson.Literal(d, i, "null")
	case '{':
	default:
		return s.wrongType(i, 2, "messages", "object")
	}
	i, end, err := chunkjson.Open(d, i)
	var buf [maxName]byte
	for ; !end && err == nil; i, end, err = chunkjson.NextMember(d, i) {
		var key []byte
		var quoted bool
		var v int
		if key, quoted, v, err = chunkjson.Key(d, i); err != nil {
			return v, err
		}
		switch string(memberName(key, quoted, &buf)) {
		case "role":
			switch d[v] {
			case '"':
				var r []byte
				r, quoted, i, err = chunkjson.String(d, v)
				if err == nil {
					m.Role = roleString(r, quoted)
				}
			case 'n': // nil, which Read refuses as it does ""
				m.Role = ""
				i, err = chunkjson.Literal(d, v, "null")
			default:
				i, err = s.wrongType(v, 3, "messages.role", "string")
			}
		case "content":
			if i, err = chunkjson.SkipValue(d, v, 3); err == nil {
				m.Content = d[v:i]
			}
		default:
			i, err = chunkjson.SkipValue(d, v, 3)
		}
		if err != nil {
			return i, err
		}
	}
	return i, err
}

// roleString returns a message's role, without allocating for the roles
// clients send.
func roleString(r []byte, quoted bool) string {
	if quoted {
		return chunkjson.Unquote(r)
	}
	switch string(r) {
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "tool":
		return "tool"
	case "developer":
		return "developer"
	case "function":
		return "function"
	}
	return string(r)
}
