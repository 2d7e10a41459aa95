package oaiformat

import "encoding/json"

// ChunkFields is what the agent needs from an engine's streamed chunk;
// the chunk itself travels on untouched.
type ChunkFields struct {
	Choices          int    // the number of elements in "choices"
	Text             string // choices[0].delta.content + choices[0].text, when Choices > 0
	FinishReason     string // choices[0].finish_reason, when HasFinish
	HasFinish        bool   // choices[0].finish_reason is a string (not null or absent)
	HasUsage         bool   // "usage" is an object (not null or absent)
	PromptTokens     uint32 // usage.prompt_tokens
	CompletionTokens uint32 // usage.completion_tokens
	TotalTokens      uint32 // usage.total_tokens
}

// engineChunk is the part of an engine chunk ReadChunk decodes.
type engineChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     uint32 `json:"prompt_tokens"`
		CompletionTokens uint32 `json:"completion_tokens"`
		TotalTokens      uint32 `json:"total_tokens"`
	} `json:"usage"`
}

// ReadChunk reads an engine chunk's fields with encoding/json, which
// validates the whole document: a chunk it refuses (invalid JSON, a value
// of the wrong type for one of these fields) is an error. A top-level
// null reads as no fields.
func ReadChunk(raw []byte) (ChunkFields, error) {
	var c engineChunk
	if err := json.Unmarshal(raw, &c); err != nil {
		return ChunkFields{}, err
	}
	f := ChunkFields{Choices: len(c.Choices)}
	if len(c.Choices) > 0 {
		ch := &c.Choices[0]
		f.Text = ch.Delta.Content + ch.Text
		if ch.FinishReason != nil {
			f.HasFinish, f.FinishReason = true, *ch.FinishReason
		}
	}
	if u := c.Usage; u != nil {
		f.HasUsage = true
		f.PromptTokens, f.CompletionTokens, f.TotalTokens = u.PromptTokens, u.CompletionTokens, u.TotalTokens
	}
	return f, nil
}
