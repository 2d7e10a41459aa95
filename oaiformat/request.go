package oaiformat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"reflect"
	"slices"
	"unicode/utf8"

	"github.com/switchyard-ai/switchyard/wire"
)

// Limits on request contents that are cheap to check here and expensive to
// discover in an engine.
const (
	MaxModelLen = 256
	MaxMessages = 4096
	MaxStops    = 16
	MaxN        = 16
)

// HandoffFields are the request members engines read as PD hand-off
// instructions: vLLM's kv_transfer_params (with do_remote_prefill and a
// remote_host it makes the engine connect where it is told) and SGLang's
// bootstrap fields (the bootstrap server and room a decode engine pulls
// KV from; the pair key, the decode TP size and the prefill DP rank that
// SGLang's router sends beside them). Switchyard's PD pipeline sets them;
// a client that sets them is refused.
var HandoffFields = []string{
	"kv_transfer_params",
	"bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
	"decode_tp_size", "disagg_prefill_dp_rank",
}

// ServiceTiers are the service_tier values a request may name. "flex"
// runs it as batch-class work; "auto", "default" and "priority" run it as
// interactive work, the highest class there is. Engines ignore the member
// (vLLM's request models allow and ignore unknown members, SGLang's ignore
// them), so the body goes on unchanged.
var ServiceTiers = []string{"auto", "default", "flex", "priority"}

// Request is what the broker needs to know of a request; the body itself
// travels to the engine.
type Request struct {
	Model        string // empty: the only served model
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	N            int
	Tools        bool // tools or functions declared
	// NoPD, when set, says why the PD pipeline cannot serve the request
	// (it goes to the regular pool or fails with this reason).
	NoPD string
	// NoMigration, when set, says why a broken stream of this request
	// cannot be continued on another agent from its text so far.
	NoMigration string
	// Flex: service_tier "flex", OpenAI's slower and cheaper tier. The
	// broker runs such a request as batch-class work, on capacity
	// interactive requests leave (see ServiceTiers).
	Flex bool

	// What the prompt's block keys are made of, as Read read it (see
	// Prompt).
	api      wire.API
	messages []message
	prompt   json.RawMessage
}

// message is what a chat message's prompt keys are made of. A role that
// is absent or null reads as "", which Read refuses alike.
type message struct {
	Role    string
	Content json.RawMessage // as written, nil when absent
}

// Read validates an OpenAI request body for api and returns its facts. A
// refusal is an *Error.
//
// The body is decoded with encoding/json, with its rules and semantics:
// the body must be one valid JSON value (at most 10000 levels deep) with
// nothing after it; null leaves a member absent; an integer member must
// read as an int64 (1.0, 1e2 and 2^63 are refused) and a float member as a
// finite float64; a value of the wrong type is an invalid_type refusal
// naming the member ("max_tokens", "messages.role"), the first in the body
// winning, and a syntax error anywhere wins over it, as it wins over data
// after the value. A duplicate member's last value wins; a repeated
// stream_options or messages decodes into what the earlier one left, as
// encoding/json decodes into a struct or reuses a slice: a role or content
// an element lacks is kept from the element at its index before.
//
// One deliberate difference from decoding into a struct: member names
// match exactly (after unescaping), not case-insensitively. encoding/json
// would read "MODEL" or "Max_Tokens" as the model and max_tokens; engines
// such as vLLM and SGLang (Python's json, pydantic) ignore such members,
// and the broker must read a body as they will. So Read walks the objects
// it checks member by member (json.Decoder's tokens) and decodes the
// values of the members it knows.
func Read(api wire.API, body []byte) (*Request, error) {
	if !utf8.Valid(body) {
		return nil, invalid("request body is not valid UTF-8", "", "invalid_encoding")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var top json.RawMessage
	if err := dec.Decode(&top); err != nil {
		return nil, syntaxError(err, len(body))
	}
	var r fields
	if top[0] == '{' {
		if err := r.object(top); err != nil {
			return nil, notJSON(err.Error()) // top is valid JSON: not reached
		}
	} else if top[0] != 'n' { // a null body decodes to no members at all
		r.mismatch(&json.UnmarshalTypeError{Value: jsonKind(top[0]), Type: objectType}, "")
	}
	if r.err != nil {
		return nil, r.err
	}
	if rest := int(dec.InputOffset()); len(bytes.TrimLeft(body[rest:], " \t\r\n")) > 0 {
		at := len(body) - len(bytes.TrimLeft(body[rest:], " \t\r\n"))
		return nil, invalid(fmt.Sprintf("request body has data after the JSON object, at offset %d", at), "", "invalid_json")
	}
	if r.handoff != 0 {
		f := HandoffFields[bits.TrailingZeros8(r.handoff)]
		return nil, invalid(f+" is a prefill/decode hand-off field that Switchyard sets itself; clients may not send it", f, "reserved_field")
	}
	p := &Request{N: 1}
	if r.model != nil {
		p.Model = *r.model
		if len(p.Model) > MaxModelLen {
			return nil, invalid(fmt.Sprintf("model id longer than %d bytes", MaxModelLen), "model", "invalid_value")
		}
	}
	if r.stream != nil {
		p.Stream = *r.stream
	}
	if t := r.serviceTier; t != nil {
		if !slices.Contains(ServiceTiers, *t) {
			return nil, invalid(fmt.Sprintf("service_tier %q is not one of auto, default, flex, priority", *t), "service_tier", "invalid_value")
		}
		p.Flex = *t == "flex"
	}
	if r.includeUsage != nil {
		if !p.Stream {
			return nil, invalid("stream_options is only allowed when stream is true", "stream_options", "invalid_value")
		}
		p.IncludeUsage = *r.includeUsage
	}
	if v := r.maxTokens; v != nil && *v < 1 {
		return nil, invalid("max_tokens must be at least 1", "max_tokens", "invalid_value")
	}
	if v := r.maxCompletionTokens; v != nil && *v < 1 {
		return nil, invalid("max_completion_tokens must be at least 1", "max_completion_tokens", "invalid_value")
	}
	if r.n != nil {
		if *r.n < 1 || *r.n > MaxN {
			return nil, invalid(fmt.Sprintf("n must be between 1 and %d", MaxN), "n", "invalid_value")
		}
		p.N = int(*r.n)
	}
	if v := r.temperature; v != nil && (*v < 0 || *v > 2) {
		return nil, invalid("temperature must be between 0 and 2", "temperature", "invalid_value")
	}
	if v := r.topP; v != nil && (*v <= 0 || *v > 1) {
		return nil, invalid("top_p must be in (0, 1]", "top_p", "invalid_value")
	}
	if r.tooManyStops {
		return nil, invalid(fmt.Sprintf("at most %d stop sequences", MaxStops), "stop", "invalid_value")
	}
	if stops, err := Stops(r.stop); err != nil {
		return nil, invalid(err.Error(), "stop", "invalid_type")
	} else if len(stops) > MaxStops {
		return nil, invalid(fmt.Sprintf("at most %d stop sequences", MaxStops), "stop", "invalid_value")
	}
	switch api {
	case wire.API_API_CHAT:
		if len(r.messages) == 0 {
			return nil, invalid("messages is required and must not be empty", "messages", "invalid_value")
		}
		if r.tooMany || len(r.messages) > MaxMessages {
			return nil, invalid(fmt.Sprintf("at most %d messages", MaxMessages), "messages", "invalid_value")
		}
		for i, m := range r.messages {
			if m.Role == "" {
				return nil, invalid(fmt.Sprintf("messages[%d].role is required", i), fmt.Sprintf("messages[%d].role", i), "invalid_value")
			}
		}
	case wire.API_API_COMPLETION:
		if len(r.prompt) == 0 || string(r.prompt) == "null" {
			return nil, invalid("prompt is required", "prompt", "invalid_value")
		}
		switch r.prompt[0] {
		case '"', '[':
		default:
			return nil, invalid("prompt must be a string or an array", "prompt", "invalid_type")
		}
	}
	p.api, p.prompt, p.messages = api, r.prompt, r.messages
	if p.N > 1 {
		p.NoPD = "n > 1 is not supported by the PD pipeline"
		p.NoMigration = "n > 1"
	}
	if Declared(r.tools) || Declared(r.functions) {
		// A continuation carries the text so far, not a half-sent tool
		// call: the new attempt would start the call again.
		p.Tools = true
		p.NoMigration = "tools"
	}
	return p, nil
}

// fields are the members of a request Read checks, as encoding/json
// decodes them (nil: absent or null).
type fields struct {
	model, serviceTier                *string
	stream, includeUsage              *bool
	maxTokens, maxCompletionTokens, n *int64
	temperature, topP                 *float64
	messages                          []message
	// The members kept as written.
	prompt, stop, tools, functions json.RawMessage
	handoff                        uint8 // bit i: HandoffFields[i] is present
	// tooMany: a messages array held more than MaxMessages elements (it
	// was not read past them); tooManyStops: the stop array more than
	// MaxStops.
	tooMany, tooManyStops bool
	err                   *Error // the first value of the wrong type
}

// objectType names a JSON object in a type refusal.
var objectType = reflect.TypeFor[map[string]any]()

// object reads the members of the request object obj.
func (r *fields) object(obj json.RawMessage) error {
	return members(obj, func(name string, v json.RawMessage) {
		switch name {
		case "model":
			r.model = decodeMember(r, v, "model", r.model)
		case "stream":
			r.stream = decodeMember(r, v, "stream", r.stream)
		case "service_tier":
			r.serviceTier = decodeMember(r, v, "service_tier", r.serviceTier)
		case "stream_options":
			r.streamOptions(v)
		case "max_tokens":
			r.maxTokens = decodeMember(r, v, "max_tokens", r.maxTokens)
		case "max_completion_tokens":
			r.maxCompletionTokens = decodeMember(r, v, "max_completion_tokens", r.maxCompletionTokens)
		case "n":
			r.n = decodeMember(r, v, "n", r.n)
		case "temperature":
			r.temperature = decodeMember(r, v, "temperature", r.temperature)
		case "top_p":
			r.topP = decodeMember(r, v, "top_p", r.topP)
		case "messages":
			r.messagesValue(v)
		case "prompt":
			r.prompt = v
		case "stop":
			r.stop = v
			r.tooManyStops = v[0] == '[' && Elements(v, MaxStops, func(int, json.RawMessage) error { return nil }) != nil
		case "tools":
			r.tools = v
		case "functions":
			r.functions = v
		default:
			// A hand-off field is refused whatever its value, null too.
			if i := slices.Index(HandoffFields, name); i >= 0 {
				r.handoff |= 1 << i
			}
		}
	})
}

// decodeMember decodes the value v of member param: nil for null, old
// when v is of the wrong type (recorded in r).
func decodeMember[T any](r *fields, v json.RawMessage, param string, old *T) *T {
	var x *T
	if err := json.Unmarshal(v, &x); err != nil {
		r.mismatch(err, param)
		return old
	}
	return x
}

// mismatch records err, a type refusal of member param, unless one came
// before it.
func (r *fields) mismatch(err error, param string) {
	if r.err != nil {
		return
	}
	where := param
	if where == "" {
		where = "request body"
	}
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		r.err = notJSON(err.Error()) // v is valid JSON: not reached
		return
	}
	want := te.Type.String()
	if te.Type.Kind() == reflect.Map {
		want = "object"
	}
	r.err = invalid(fmt.Sprintf("%s: expected %s, got JSON %s", where, want, te.Value), param, "invalid_type")
}

// streamOptions reads stream_options: an object decodes into what an
// earlier one left (only null unsets include_usage).
func (r *fields) streamOptions(v json.RawMessage) {
	switch v[0] {
	case 'n':
		r.includeUsage = nil
	case '{':
		_ = members(v, func(name string, v json.RawMessage) {
			if name == "include_usage" {
				r.includeUsage = decodeMember(r, v, "stream_options.include_usage", r.includeUsage)
			}
		})
	default:
		r.mismatch(&json.UnmarshalTypeError{Value: jsonKind(v[0]), Type: objectType}, "stream_options")
	}
}

// messagesValue reads messages. Element i decodes into the element an
// earlier messages array left at index i, as encoding/json reuses a
// slice's backing array, up to its capacity (beyond what earlier arrays
// wrote, elements are zero); an empty array forgets them.
func (r *fields) messagesValue(v json.RawMessage) {
	switch v[0] {
	case 'n':
		r.messages = nil
		return
	case '[':
	default:
		r.mismatch(&json.UnmarshalTypeError{Value: jsonKind(v[0]), Type: reflect.TypeFor[[]json.RawMessage]()}, "messages")
		return
	}
	if r.tooMany {
		return // refused whatever comes after
	}
	// The array is walked element by element and not past the bound: a
	// long array of tiny elements costs its first MaxMessages, not a
	// decoded slice of all of them.
	msgs := r.messages[:0]
	n := 0
	err := Elements(v, MaxMessages, func(i int, e json.RawMessage) error {
		n = i + 1
		if i < cap(msgs) {
			msgs = msgs[:i+1]
		} else {
			msgs = append(msgs, message{})
		}
		m := &msgs[i]
		switch e[0] {
		case 'n': // null leaves an element as it is
		case '{':
			_ = members(e, func(name string, v json.RawMessage) {
				switch name {
				case "role":
					if role := decodeMember(r, v, "messages.role", &m.Role); role != nil {
						m.Role = *role
					} else {
						m.Role = "" // null, which Read refuses as it does ""
					}
				case "content":
					m.Content = v
				}
			})
		default:
			r.mismatch(&json.UnmarshalTypeError{Value: jsonKind(e[0]), Type: objectType}, "messages")
		}
		return nil
	})
	if errors.Is(err, ErrTooManyElements) {
		r.tooMany, r.messages = true, nil
		return
	}
	if n == 0 {
		msgs = []message{}
	}
	r.messages = msgs
}

// members calls fn with the name (unescaped, exactly as written) and the
// value of each member of obj, a valid JSON object, in order.
func members(obj json.RawMessage, fn func(name string, value json.RawMessage)) error {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		fn(t.(string), v)
	}
	return nil
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

// syntaxError is the refusal of a body encoding/json cannot read as one
// JSON value: where it broke off, as an offset into the body of n bytes.
func syntaxError(err error, n int) *Error {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		// Offset counts the bytes read, the offending one included.
		return notJSON(fmt.Sprintf("%s at offset %d", se.Error(), se.Offset-1))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return notJSON(fmt.Sprintf("unexpected end of JSON input at offset %d", n))
	}
	return notJSON(err.Error())
}

func notJSON(what string) *Error {
	return invalid("request body is not valid JSON: "+what, "", "invalid_json")
}

// Declared reports whether a request member's JSON value (such as "tools")
// holds something: present, not null and not an empty array.
func Declared(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null")) && !bytes.Equal(bytes.Join(bytes.Fields(t), nil), []byte("[]"))
}

// CheckJSON turns a JSON decoding error into the request error a client
// sees: the member and type at fault, or invalid JSON.
func CheckJSON(err error) error { return jsonError(err) }

func jsonError(err error) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return invalid(fmt.Sprintf("%s: expected %s, got JSON %s", te.Field, te.Type, te.Value), te.Field, "invalid_type")
	}
	return invalid("request body is not valid JSON: "+err.Error(), "", "invalid_json")
}
