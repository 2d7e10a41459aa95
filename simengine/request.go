package simengine

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/switchyard-ai/switchyard/oaiformat"
)

const (
	// DefaultMaxTokens is the generation limit when a request sets none.
	DefaultMaxTokens = 256
	// MaxTokensLimit bounds max_tokens, standing in for a model's context
	// length so that a request cannot occupy a slot for ever.
	MaxTokensLimit = 1 << 20
	// MaxN bounds n, the choices of one request (oaiformat.MaxN, the
	// broker's bound).
	MaxN = oaiformat.MaxN
)

// request is a validated OpenAI request reduced to what the simulator uses.
type request struct {
	api    API
	model  string
	prompt string // rendered chat prompt, or the completion prompt
	// chat holds a chat's messages (role, text content) for the ChatML
	// rendering of KVHashTokens; nil for a completion.
	chat          []chatText
	continueFinal bool
	maxTokens     int
	// n is how many choices to generate (at least 1).
	n            int
	stops        []string
	stream       bool
	includeUsage bool

	// pdRaw is kept undecoded so that a regular engine ignores it as it
	// ignores any unknown field; PD engines decode it in checkPD.
	pdRaw pdFields
	pd    *pdLeg // nil on a regular engine
}

// pdFields are the request fields of the PD hand-off protocols.
type pdFields struct {
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost    json.RawMessage `json:"bootstrap_host"`
	BootstrapPort    json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom    json.RawMessage `json:"bootstrap_room"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type chatBody struct {
	Model                string          `json:"model"`
	Messages             []chatMessage   `json:"messages"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	Stop                 json.RawMessage `json:"stop"`
	N                    *int            `json:"n"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	pdFields
}

type completionBody struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stop          json.RawMessage `json:"stop"`
	N             *int            `json:"n"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	pdFields
}

// parseRequest decodes and validates body. Every error is an *Error.
func parseRequest(api API, body []byte) (*request, *Error) {
	switch api {
	case APIChat:
		return parseChat(body)
	case APICompletion:
		return parseCompletion(body)
	default:
		return nil, badRequest("", "unknown API %d", int(api))
	}
}

func decode(body []byte, v any) *Error {
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("", "invalid request body: %v", err)
	}
	return nil
}

func parseChat(body []byte) (*request, *Error) {
	var b chatBody
	if err := decode(body, &b); err != nil {
		return nil, err
	}
	if len(b.Messages) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty array")
	}
	r := &request{api: APIChat, model: b.Model, stream: b.Stream, pdRaw: b.pdFields}
	var err *Error
	if r.chat, err = chatTexts(b.Messages); err != nil {
		return nil, err
	}
	r.continueFinal = b.ContinueFinalMessage
	r.prompt = renderChat(r.chat, b.ContinueFinalMessage)
	limit, param := b.MaxCompletionTokens, "max_completion_tokens"
	if limit == nil {
		limit, param = b.MaxTokens, "max_tokens"
	}
	if err := r.common(limit, param, b.N, b.Stop, b.StreamOptions); err != nil {
		return nil, err
	}
	return r, nil
}

func parseCompletion(body []byte) (*request, *Error) {
	var b completionBody
	if err := decode(body, &b); err != nil {
		return nil, err
	}
	r := &request{api: APICompletion, model: b.Model, stream: b.Stream, pdRaw: b.pdFields}
	var err *Error
	if r.prompt, err = completionPrompt(b.Prompt); err != nil {
		return nil, err
	}
	if err := r.common(b.MaxTokens, "max_tokens", b.N, b.Stop, b.StreamOptions); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *request) common(maxTokens *int, param string, n *int, stop json.RawMessage, so *streamOptions) *Error {
	r.maxTokens = DefaultMaxTokens
	if maxTokens != nil {
		if *maxTokens < 1 || *maxTokens > MaxTokensLimit {
			return badRequest(param, "%s must be between 1 and %d, got %d", param, MaxTokensLimit, *maxTokens)
		}
		r.maxTokens = *maxTokens
	}
	r.n = 1
	if n != nil {
		if *n < 1 || *n > MaxN {
			return badRequest("n", "n must be between 1 and %d, got %d", MaxN, *n)
		}
		r.n = *n
	}
	var err *Error
	if r.stops, err = parseStop(stop); err != nil {
		return err
	}
	// A non-streaming request needs its usage to assemble the response, so
	// in-process callers get the usage chunk for it as well.
	r.includeUsage = !r.stream || (so != nil && so.IncludeUsage)
	return nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func completionPrompt(raw json.RawMessage) (string, *Error) {
	if isNull(raw) {
		return "", badRequest("prompt", "prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return "", badRequest("prompt", "prompt must be a string or an array of one string, got %d strings", len(list))
		}
		return list[0], nil
	}
	return "", badRequest("prompt", "prompt must be a string or an array of one string (token ids are not supported)")
}

func parseStop(raw json.RawMessage) ([]string, *Error) {
	stops, err := oaiformat.Stops(raw)
	if err != nil {
		return nil, badRequest("stop", "%v", err)
	}
	return stops, nil
}

func messageContent(i int, raw json.RawMessage) (string, *Error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []contentPart
	if json.Unmarshal(raw, &parts) != nil {
		return "", badRequest("messages", "messages[%d].content must be a string or an array of text parts", i)
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", badRequest("messages", "messages[%d].content: part type %q is not supported", i, p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// chatText is one chat message reduced to its text.
type chatText struct {
	role, content string
}

// chatTexts validates msgs and returns their text.
func chatTexts(msgs []chatMessage) ([]chatText, *Error) {
	out := make([]chatText, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("messages", "messages[%d].role is required", i)
		}
		content, err := messageContent(i, m.Content)
		if err != nil {
			return nil, err
		}
		out[i] = chatText{m.Role, content}
	}
	return out, nil
}

// renderChat is the simulator's chat template (see the package comment).
func renderChat(msgs []chatText, continueFinal bool) string {
	var sb strings.Builder
	last := len(msgs) - 1
	cont := continueFinal && msgs[last].role == "assistant"
	for i, m := range msgs {
		sb.WriteString(m.role)
		sb.WriteString(": ")
		sb.WriteString(m.content)
		if i == last && cont {
			return sb.String()
		}
		sb.WriteByte('\n')
	}
	sb.WriteString("assistant:")
	return sb.String()
}

// renderChatML is the template of KVHashTokens, ChatML's (Qwen's and
// others'), unlike the broker's rendering: "<|im_start|>role\ncontent
// <|im_end|>\n" per message, then "<|im_start|>assistant\n" when
// generating.
func renderChatML(msgs []chatText, addGeneration, continueFinal bool) string {
	var sb strings.Builder
	last := len(msgs) - 1
	for i, m := range msgs {
		sb.WriteString("<|im_start|>")
		sb.WriteString(m.role)
		sb.WriteByte('\n')
		sb.WriteString(m.content)
		if i == last && continueFinal && m.role == "assistant" {
			return sb.String()
		}
		sb.WriteString("<|im_end|>\n")
	}
	if addGeneration {
		sb.WriteString("<|im_start|>assistant\n")
	}
	return sb.String()
}

// cacheText is the text the prefix cache of KVHashTokens tokenizes.
func (r *request) cacheText() string {
	if r.chat == nil {
		return r.prompt
	}
	return renderChatML(r.chat, true, r.continueFinal)
}
