package oaiformat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"unicode/utf8"

	"github.com/switchyard-ai/switchyard/oaiformat/chunkjson"
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

	// What the prompt's block keys are made of, as Read read it (see
	// Prompt); slices of the body.
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

// Read validates an OpenAI request body for api in one pass over it and
// returns its facts. A refusal is an *Error. The Request refers to body
// (the prompt's block keys are read from it): body must not change while
// the Request is in use.
//
// Read decides as encoding/json's decoding of the members it checks would,
// but for member names, which it matches exactly, as the engines do (see
// readFields).
func Read(api wire.API, body []byte) (*Request, error) {
	if !utf8.Valid(body) {
		return nil, invalid("request body is not valid UTF-8", "", "invalid_encoding")
	}
	s := readScan{d: body}
	if err := s.scan(); err != nil {
		return nil, err
	}
	r := &s.f
	if r.handoff != 0 {
		f := HandoffFields[bits.TrailingZeros8(r.handoff)]
		return nil, invalid(f+" is a prefill/decode hand-off field that Switchyard sets itself; clients may not send it", f, "reserved_field")
	}
	p := &Request{N: 1}
	if r.set&hasModel != 0 {
		if r.modelQuoted {
			p.Model = chunkjson.Unquote(r.model)
		} else {
			p.Model = string(r.model)
		}
		if len(p.Model) > MaxModelLen {
			return nil, invalid(fmt.Sprintf("model id longer than %d bytes", MaxModelLen), "model", "invalid_value")
		}
	}
	if r.set&hasStream != 0 {
		p.Stream = r.stream
	}
	if r.set&hasInclude != 0 {
		if !p.Stream {
			return nil, invalid("stream_options is only allowed when stream is true", "stream_options", "invalid_value")
		}
		p.IncludeUsage = r.include
	}
	if r.set&hasMaxTokens != 0 && r.maxTokens < 1 {
		return nil, invalid("max_tokens must be at least 1", "max_tokens", "invalid_value")
	}
	if r.set&hasMaxCompl != 0 && r.maxCompl < 1 {
		return nil, invalid("max_completion_tokens must be at least 1", "max_completion_tokens", "invalid_value")
	}
	if r.set&hasN != 0 {
		if r.n < 1 || r.n > MaxN {
			return nil, invalid(fmt.Sprintf("n must be between 1 and %d", MaxN), "n", "invalid_value")
		}
		p.N = int(r.n)
	}
	if r.set&hasTemperature != 0 && (r.temperature < 0 || r.temperature > 2) {
		return nil, invalid("temperature must be between 0 and 2", "temperature", "invalid_value")
	}
	if r.set&hasTopP != 0 && (r.topP <= 0 || r.topP > 1) {
		return nil, invalid("top_p must be in (0, 1]", "top_p", "invalid_value")
	}
	if r.stop != nil {
		if stops, err := Stops(r.stop); err != nil {
			return nil, invalid(err.Error(), "stop", "invalid_type")
		} else if len(stops) > MaxStops {
			return nil, invalid(fmt.Sprintf("at most %d stop sequences", MaxStops), "stop", "invalid_value")
		}
	}
	switch api {
	case wire.API_API_CHAT:
		if len(r.messages) == 0 {
			return nil, invalid("messages is required and must not be empty", "messages", "invalid_value")
		}
		if len(r.messages) > MaxMessages {
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
