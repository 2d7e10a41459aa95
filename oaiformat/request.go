package oaiformat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	// What the prompt's block keys are made of, as Read decoded it
	// (see Prompt).
	api      wire.API
	messages []message
	prompt   json.RawMessage
}

// present records that a member was in the body, whatever its value.
type present bool

func (p *present) UnmarshalJSON([]byte) error { *p = true; return nil }

// request holds the typed fields the format checks. Everything else is the
// engine's business and passes through.
type request struct {
	Model         *string `json:"model"`
	Stream        *bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	N                   *int64          `json:"n"`
	Messages            *[]message      `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stop                json.RawMessage `json:"stop"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Tools               json.RawMessage `json:"tools"`
	Functions           json.RawMessage `json:"functions"`

	// The hand-off fields, in the order of HandoffFields.
	KVTransferParams    present `json:"kv_transfer_params"`
	BootstrapHost       present `json:"bootstrap_host"`
	BootstrapPort       present `json:"bootstrap_port"`
	BootstrapRoom       present `json:"bootstrap_room"`
	BootstrapPairKey    present `json:"bootstrap_pair_key"`
	DecodeTPSize        present `json:"decode_tp_size"`
	DisaggPrefillDPRank present `json:"disagg_prefill_dp_rank"`
}

func (r *request) handoff() string {
	for i, p := range [...]present{r.KVTransferParams, r.BootstrapHost, r.BootstrapPort, r.BootstrapRoom, r.BootstrapPairKey, r.DecodeTPSize, r.DisaggPrefillDPRank} {
		if p {
			return HandoffFields[i]
		}
	}
	return ""
}

type message struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

// Read validates an OpenAI request body for api in one decode and returns
// its facts. A refusal is an *Error.
func Read(api wire.API, body []byte) (*Request, error) {
	if !utf8.Valid(body) {
		return nil, invalid("request body is not valid UTF-8", "", "invalid_encoding")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var r request
	if err := dec.Decode(&r); err != nil {
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, invalid("request body has data after the JSON object", "", "invalid_json")
	}
	if f := r.handoff(); f != "" {
		return nil, invalid(f+" is a prefill/decode hand-off field that Switchyard sets itself; clients may not send it", f, "reserved_field")
	}
	p := &Request{N: 1}
	if r.Model != nil {
		p.Model = *r.Model
		if len(p.Model) > MaxModelLen {
			return nil, invalid(fmt.Sprintf("model id longer than %d bytes", MaxModelLen), "model", "invalid_value")
		}
	}
	if r.Stream != nil {
		p.Stream = *r.Stream
	}
	if r.StreamOptions != nil && r.StreamOptions.IncludeUsage != nil {
		if !p.Stream {
			return nil, invalid("stream_options is only allowed when stream is true", "stream_options", "invalid_value")
		}
		p.IncludeUsage = *r.StreamOptions.IncludeUsage
	}
	if v := r.MaxTokens; v != nil && *v < 1 {
		return nil, invalid("max_tokens must be at least 1", "max_tokens", "invalid_value")
	}
	if v := r.MaxCompletionTokens; v != nil && *v < 1 {
		return nil, invalid("max_completion_tokens must be at least 1", "max_completion_tokens", "invalid_value")
	}
	if r.N != nil {
		if *r.N < 1 || *r.N > MaxN {
			return nil, invalid(fmt.Sprintf("n must be between 1 and %d", MaxN), "n", "invalid_value")
		}
		p.N = int(*r.N)
	}
	if r.Temperature != nil && (*r.Temperature < 0 || *r.Temperature > 2) {
		return nil, invalid("temperature must be between 0 and 2", "temperature", "invalid_value")
	}
	if r.TopP != nil && (*r.TopP <= 0 || *r.TopP > 1) {
		return nil, invalid("top_p must be in (0, 1]", "top_p", "invalid_value")
	}
	if stops, err := Stops(r.Stop); err != nil {
		return nil, invalid(err.Error(), "stop", "invalid_type")
	} else if len(stops) > MaxStops {
		return nil, invalid(fmt.Sprintf("at most %d stop sequences", MaxStops), "stop", "invalid_value")
	}
	switch api {
	case wire.API_API_CHAT:
		if r.Messages == nil || len(*r.Messages) == 0 {
			return nil, invalid("messages is required and must not be empty", "messages", "invalid_value")
		}
		if len(*r.Messages) > MaxMessages {
			return nil, invalid(fmt.Sprintf("at most %d messages", MaxMessages), "messages", "invalid_value")
		}
		for i, m := range *r.Messages {
			if m.Role == nil || *m.Role == "" {
				return nil, invalid(fmt.Sprintf("messages[%d].role is required", i), fmt.Sprintf("messages[%d].role", i), "invalid_value")
			}
		}
	case wire.API_API_COMPLETION:
		if len(r.Prompt) == 0 || bytes.Equal(r.Prompt, []byte("null")) {
			return nil, invalid("prompt is required", "prompt", "invalid_value")
		}
		switch r.Prompt[0] {
		case '"', '[':
		default:
			return nil, invalid("prompt must be a string or an array", "prompt", "invalid_type")
		}
	}
	p.api, p.prompt = api, r.Prompt
	if r.Messages != nil {
		p.messages = *r.Messages
	}
	if p.N > 1 {
		p.NoPD = "n > 1 is not supported by the PD pipeline"
		p.NoMigration = "n > 1"
	}
	if Declared(r.Tools) || Declared(r.Functions) {
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
