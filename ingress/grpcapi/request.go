package grpcapi

import (
	"bytes"
	"encoding/json"
	"fmt"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/oaiformat"
)

// Limits on request contents, the same as the HTTP ingress's: cheap to check
// here and expensive to discover in an engine.
const (
	maxModelLen = oaiformat.MaxModelLen
	maxMessages = oaiformat.MaxMessages
	maxStops    = oaiformat.MaxStops
)

// reserved are the body keys the ingress owns: extra_json must not set them.
// n is among them because one stream carries one choice.
var reserved = [...]string{"model", "messages", "prompt", "stream", "stream_options", "n"}

// params are the typed fields chat and completion requests share.
type params struct {
	model        string
	maxTokens    *uint32
	temperature  *float64
	topP         *float64
	seed         *int64
	stop         []string
	includeUsage bool
	extraJSON    string
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatBody validates r and renders it as an OpenAI chat completion request.
func chatBody(r *switchyardv1.ChatRequest) ([]byte, error) {
	msgs := r.GetMessages()
	if len(msgs) == 0 {
		return nil, invalid("messages is required and must not be empty")
	}
	if len(msgs) > maxMessages {
		return nil, invalid("at most %d messages", maxMessages)
	}
	out := make([]chatMessage, len(msgs))
	for i, m := range msgs {
		if m.GetRole() == "" {
			return nil, invalid("messages[%d].role is required", i)
		}
		out[i] = chatMessage{Role: m.GetRole(), Content: m.GetContent()}
	}
	return render(params{
		model: r.GetModel(), maxTokens: r.MaxTokens, temperature: r.Temperature, topP: r.TopP,
		seed: r.Seed, stop: r.GetStop(), includeUsage: r.GetIncludeUsage(), extraJSON: r.GetExtraJson(),
	}, "messages", out)
}

// completionBody validates r and renders it as an OpenAI completion request.
func completionBody(r *switchyardv1.CompletionRequest) ([]byte, error) {
	if r.GetPrompt() == "" {
		return nil, invalid("prompt is required")
	}
	return render(params{
		model: r.GetModel(), maxTokens: r.MaxTokens, temperature: r.Temperature, topP: r.TopP,
		seed: r.Seed, stop: r.GetStop(), includeUsage: r.GetIncludeUsage(), extraJSON: r.GetExtraJson(),
	}, "prompt", r.GetPrompt())
}

// render builds the body: extra_json first, then the typed fields over it,
// so typed fields win. Keys come out sorted, so equal requests give equal
// bodies.
func render(p params, inputKey string, input any) ([]byte, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	body := map[string]json.RawMessage{}
	if p.extraJSON != "" {
		if err := json.Unmarshal([]byte(p.extraJSON), &body); err != nil || body == nil {
			return nil, invalid("extra_json must be a JSON object")
		}
		for _, k := range reserved {
			if _, ok := body[k]; ok {
				return nil, invalid("extra_json must not set %q: it is the ingress's own field", k)
			}
		}
	}
	var encErr error
	set := func(k string, v any) {
		raw, err := marshal(v)
		if err != nil && encErr == nil {
			encErr = fmt.Errorf("field %s: %w", k, err)
		}
		body[k] = raw
	}
	if p.model != "" {
		set("model", p.model)
	}
	set(inputKey, input)
	set("stream", true)
	set("stream_options", map[string]bool{"include_usage": p.includeUsage})
	if p.maxTokens != nil {
		set("max_tokens", *p.maxTokens)
	}
	if p.temperature != nil {
		set("temperature", *p.temperature)
	}
	if p.topP != nil {
		set("top_p", *p.topP)
	}
	if p.seed != nil {
		set("seed", *p.seed)
	}
	if len(p.stop) > 0 {
		set("stop", p.stop)
	}
	if encErr != nil {
		return nil, invalid("encoding the request: %v", encErr)
	}
	out, err := marshal(body)
	if err != nil {
		return nil, invalid("encoding the request: %v", err)
	}
	return out, nil
}

func (p *params) check() error {
	if len(p.model) > maxModelLen {
		return invalid("model id longer than %d bytes", maxModelLen)
	}
	if p.maxTokens != nil && *p.maxTokens < 1 {
		return invalid("max_tokens must be at least 1")
	}
	// Written so that NaN fails too.
	if t := p.temperature; t != nil && !(*t >= 0 && *t <= 2) {
		return invalid("temperature must be between 0 and 2")
	}
	if t := p.topP; t != nil && !(*t > 0 && *t <= 1) {
		return invalid("top_p must be in (0, 1]")
	}
	if len(p.stop) > maxStops {
		return invalid("at most %d stop sequences", maxStops)
	}
	for i, s := range p.stop {
		if s == "" {
			return invalid("stop[%d] is empty", i)
		}
	}
	return nil
}

// marshal encodes v without HTML escaping, so text reaches the engine as the
// client wrote it.
func marshal(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
