package openaihttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/wire"
)

// Limits on request contents that are cheap to check here and expensive to
// discover in an engine.
const (
	maxModelLen = 256
	maxMessages = 4096
	maxStops    = 16
	maxN        = 16
)

// parsed is what the ingress needs to know of a request; the body itself
// travels to the engine unchanged.
type parsed struct {
	Model        string
	Stream       bool
	IncludeUsage bool
	N            int
	Need         dispatch.Need
	// NoMigration says why a broken stream of this request cannot be
	// continued on another agent (see broker.Request).
	NoMigration string
}

// request holds the typed fields the broker checks. Everything else is the
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
}

type message struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

// parseRequest validates an OpenAI request body for api.
func parseRequest(api wire.API, body []byte) (*parsed, *apiError) {
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
	p := &parsed{N: 1}
	if r.Model != nil {
		p.Model = *r.Model
		if len(p.Model) > maxModelLen {
			return nil, invalid(fmt.Sprintf("model id longer than %d bytes", maxModelLen), "model", "invalid_value")
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
	for name, v := range map[string]*int64{"max_tokens": r.MaxTokens, "max_completion_tokens": r.MaxCompletionTokens} {
		if v != nil && *v < 1 {
			return nil, invalid(name+" must be at least 1", name, "invalid_value")
		}
	}
	if r.N != nil {
		if *r.N < 1 || *r.N > maxN {
			return nil, invalid(fmt.Sprintf("n must be between 1 and %d", maxN), "n", "invalid_value")
		}
		p.N = int(*r.N)
	}
	if r.Temperature != nil && (*r.Temperature < 0 || *r.Temperature > 2) {
		return nil, invalid("temperature must be between 0 and 2", "temperature", "invalid_value")
	}
	if r.TopP != nil && (*r.TopP <= 0 || *r.TopP > 1) {
		return nil, invalid("top_p must be in (0, 1]", "top_p", "invalid_value")
	}
	if err := checkStop(r.Stop); err != nil {
		return nil, err
	}
	switch api {
	case wire.API_API_CHAT:
		if r.Messages == nil || len(*r.Messages) == 0 {
			return nil, invalid("messages is required and must not be empty", "messages", "invalid_value")
		}
		if len(*r.Messages) > maxMessages {
			return nil, invalid(fmt.Sprintf("at most %d messages", maxMessages), "messages", "invalid_value")
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
	if p.N > 1 {
		p.Need = dispatch.Need{NoPD: true, Reason: "n > 1 is not supported by the PD pipeline"}
		p.NoMigration = "n > 1"
	}
	if broker.Declared(r.Tools) || broker.Declared(r.Functions) {
		// A continuation carries the text so far, not a half-sent tool
		// call: the new attempt would start the call again.
		p.NoMigration = "tools"
	}
	return p, nil
}

func checkStop(raw json.RawMessage) *apiError {
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return invalid("stop must be a string or an array of strings", "stop", "invalid_type")
	}
	if len(many) > maxStops {
		return invalid(fmt.Sprintf("at most %d stop sequences", maxStops), "stop", "invalid_value")
	}
	return nil
}

func jsonError(err error) *apiError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return invalid(fmt.Sprintf("%s: expected %s, got JSON %s", te.Field, te.Type, te.Value), te.Field, "invalid_type")
	}
	return invalid("request body is not valid JSON: "+err.Error(), "", "invalid_json")
}
