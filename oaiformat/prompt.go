package oaiformat

import (
	"encoding/json"
	"strings"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/wire"
)

// promptBody holds what a prompt's block keys need of a request.
type promptBody struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt json.RawMessage `json:"prompt"`
}

// PromptKeys appends to dst the block keys (affinity.AppendChatKeys,
// affinity.AppendKeys) of a validated request's prompt: a chat's messages
// (text content, text parts joined) or a completion's prompt (a string,
// or an array of one). It returns dst unchanged for a body it cannot key
// (embeddings, token-id prompts): such a request simply has no prefix to
// match.
func PromptKeys(dst []uint64, blockSize int, api wire.API, body []byte) []uint64 {
	p, ok := PromptOf(api, body)
	if !ok {
		return dst
	}
	return p.AppendKeys(dst, blockSize)
}

// Prompt is what the broker keys of a request's prompt are made of.
type Prompt struct {
	// Chat tells a chat prompt (Messages) from a completion one (Text).
	Chat     bool
	Messages []affinity.Message
	Text     string
}

// PromptOf returns the prompt PromptKeys keys, false for a body without
// one.
func PromptOf(api wire.API, body []byte) (Prompt, bool) {
	var b promptBody
	if json.Unmarshal(body, &b) != nil {
		return Prompt{}, false
	}
	msgs := make([]message, len(b.Messages))
	for i, m := range b.Messages {
		msgs[i] = message{Role: m.Role, Content: m.Content}
	}
	return promptOf(api, msgs, b.Prompt)
}

// Prompt returns the prompt of the request Read validated, as PromptOf
// returns it from the body, without decoding the body again.
func (r *Request) Prompt() (Prompt, bool) {
	return promptOf(r.api, r.messages, r.prompt)
}

// AppendKeys appends to dst the block keys of p (see PromptKeys).
func (p Prompt) AppendKeys(dst []uint64, blockSize int) []uint64 {
	if p.Chat {
		return affinity.AppendChatKeys(dst, blockSize, p.Messages)
	}
	return affinity.AppendKeys(dst, blockSize, p.Text)
}

func promptOf(api wire.API, messages []message, prompt json.RawMessage) (Prompt, bool) {
	switch api {
	case wire.API_API_CHAT:
		if len(messages) == 0 {
			return Prompt{}, false
		}
		msgs := make([]affinity.Message, len(messages))
		for i, m := range messages {
			msgs[i].Role = m.Role
			msgs[i].Content = textContent(m.Content)
		}
		return Prompt{Chat: true, Messages: msgs}, true
	case wire.API_API_COMPLETION:
		if s, ok := plainString(prompt); ok {
			return Prompt{Text: s}, true
		}
		var s string
		if json.Unmarshal(prompt, &s) == nil {
			return Prompt{Text: s}, true
		}
		var list []string
		if json.Unmarshal(prompt, &list) == nil && len(list) == 1 {
			return Prompt{Text: list[0]}, true
		}
	}
	return Prompt{}, false
}

// plainString returns the JSON string raw, when it is one without escapes
// (which then reads as it is written; raw is valid UTF-8 JSON).
func plainString(raw json.RawMessage) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	for _, c := range in {
		if c == '\\' || c == '"' || c < 0x20 {
			return "", false
		}
	}
	return string(in), true
}

// textContent is a message's text: a string, or its text parts joined.
func textContent(raw json.RawMessage) string {
	if s, ok := plainString(raw); ok {
		return s
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	return sb.String()
}
