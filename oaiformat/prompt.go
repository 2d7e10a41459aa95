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
	switch {
	case !ok:
		return dst
	case p.Chat:
		return affinity.AppendChatKeys(dst, blockSize, p.Messages)
	default:
		return affinity.AppendKeys(dst, blockSize, p.Text)
	}
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
	switch api {
	case wire.API_API_CHAT:
		if len(b.Messages) == 0 {
			return Prompt{}, false
		}
		msgs := make([]affinity.Message, len(b.Messages))
		for i, m := range b.Messages {
			msgs[i] = affinity.Message{Role: m.Role, Content: textContent(m.Content)}
		}
		return Prompt{Chat: true, Messages: msgs}, true
	case wire.API_API_COMPLETION:
		var s string
		if json.Unmarshal(b.Prompt, &s) == nil {
			return Prompt{Text: s}, true
		}
		var list []string
		if json.Unmarshal(b.Prompt, &list) == nil && len(list) == 1 {
			return Prompt{Text: list[0]}, true
		}
	}
	return Prompt{}, false
}

// textContent is a message's text: a string, or its text parts joined.
func textContent(raw json.RawMessage) string {
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
