package oaiformat

import (
	"bytes"
	"encoding/json"
	"sync"
)

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
	Choices []engineChoice `json:"choices"`
	Usage   *struct {
		PromptTokens     uint32 `json:"prompt_tokens"`
		CompletionTokens uint32 `json:"completion_tokens"`
		TotalTokens      uint32 `json:"total_tokens"`
	} `json:"usage"`
}

type engineChoice struct {
	Text  string `json:"text"`
	Delta struct {
		Content string `json:"content"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

// ReadChunk reads an engine chunk's fields with encoding/json, which
// validates the whole document: a chunk it refuses (invalid JSON, a value
// of the wrong type for one of these fields) is an error. A top-level
// null reads as no fields. It reads what json.Unmarshal reads, through a
// json.Decoder kept between calls: the decoder's state and the decoded
// struct are reused, so a chunk costs the allocations of the strings it
// yields, not those of a decoder per chunk.
func ReadChunk(raw []byte) (ChunkFields, error) {
	r := chunkReaders.Get().(*chunkReader)
	f, err := r.readChunk(raw)
	chunkReaders.Put(r)
	return f, err
}

// readChunk is ReadChunk with r's decoder.
func (r *chunkReader) readChunk(raw []byte) (ChunkFields, error) {
	f, ok := r.read(raw)
	if !ok {
		// Anything the kept decoder does not take plainly (an error, text
		// after the value) is read again by json.Unmarshal, whose answer
		// and error are the contract; the decoder, which may hold part of
		// the refused chunk, is dropped.
		r.dec, r.fed = nil, 0
		var c engineChunk
		if err := json.Unmarshal(raw, &c); err != nil {
			return ChunkFields{}, err
		}
		return c.fields(), nil
	}
	if len(raw) > keptChunkReader {
		r.dec, r.fed = nil, 0 // its buffer grew to the chunk's size
	}
	return f, nil
}

// keptChunkReader is the largest chunk after which a reader's decoder
// (whose buffer grows to hold the chunk) is kept for the next.
const keptChunkReader = 16 << 10

var chunkReaders = sync.Pool{New: func() any { return new(chunkReader) }}

// chunkReader decodes one chunk after another with one json.Decoder fed
// from src, into one engineChunk. fed is how many bytes the decoder has
// been given so far: a chunk's value ends at dec.InputOffset()-fed bytes
// into it.
type chunkReader struct {
	src bytes.Reader
	dec *json.Decoder
	fed int64
	c   engineChunk
}

// read decodes raw, and reports false where json.Unmarshal must decide:
// the decoder failed, or raw holds more than one value and whitespace.
func (r *chunkReader) read(raw []byte) (ChunkFields, bool) {
	r.src.Reset(raw)
	if r.dec == nil {
		r.dec, r.fed = json.NewDecoder(&r.src), 0
	}
	// The decoder writes into the elements of a slice it reuses without
	// zeroing them: every field starts empty, as in a new struct.
	choices := r.c.Choices[:cap(r.c.Choices)]
	clear(choices)
	r.c = engineChunk{Choices: choices[:0]}
	if r.dec.Decode(&r.c) != nil {
		return ChunkFields{}, false
	}
	end := r.dec.InputOffset() - r.fed
	if end < 0 || end > int64(len(raw)) || !blank(raw[end:]) {
		return ChunkFields{}, false
	}
	// What the decoder did not read of raw is blank: dropped. What it
	// read past the value is blank too, and skipped before the next.
	r.fed += int64(len(raw) - r.src.Len())
	return r.c.fields(), true
}

// blank reports whether b is JSON whitespace only.
func blank(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
		default:
			return false
		}
	}
	return true
}

func (c *engineChunk) fields() ChunkFields {
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
	return f
}
