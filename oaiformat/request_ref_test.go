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

// readReference is Read as it was before its one-pass scan: the body
// decoded by encoding/json into refRequest, then the same checks. FuzzRead
// holds Read to it. Only its last lines differ, to build a Request of
// today's shape (a message's role as a string, "" for nil).

// refPresent records that a member was in the body, whatever its value.
type refPresent bool

func (p *refPresent) UnmarshalJSON([]byte) error { *p = true; return nil }

type refRequest struct {
	Model         *string `json:"model"`
	Stream        *bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	N                   *int64          `json:"n"`
	Messages            *[]refMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stop                json.RawMessage `json:"stop"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Tools               json.RawMessage `json:"tools"`
	Functions           json.RawMessage `json:"functions"`

	// The hand-off fields, in the order of HandoffFields.
	KVTransferParams    refPresent `json:"kv_transfer_params"`
	BootstrapHost       refPresent `json:"bootstrap_host"`
	BootstrapPort       refPresent `json:"bootstrap_port"`
	BootstrapRoom       refPresent `json:"bootstrap_room"`
	BootstrapPairKey    refPresent `json:"bootstrap_pair_key"`
	DecodeTPSize        refPresent `json:"decode_tp_size"`
	DisaggPrefillDPRank refPresent `json:"disagg_prefill_dp_rank"`
}

func (r *refRequest) handoff() string {
	for i, p := range [...]refPresent{r.KVTransferParams, r.BootstrapHost, r.BootstrapPort, r.BootstrapRoom, r.BootstrapPairKey, r.DecodeTPSize, r.DisaggPrefillDPRank} {
		if p {
			return HandoffFields[i]
		}
	}
	return ""
}

type refMessage struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

func readReference(api wire.API, body []byte) (*Request, error) {
	if !utf8.Valid(body) {
		return nil, invalid("request body is not valid UTF-8", "", "invalid_encoding")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var r refRequest
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
		// Today's shape of a message.
		p.messages = make([]message, len(*r.Messages))
		for i, m := range *r.Messages {
			if m.Role != nil {
				p.messages[i].Role = *m.Role
			}
			p.messages[i].Content = m.Content
		}
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
