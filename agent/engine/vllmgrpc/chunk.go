package vllmgrpc

import (
	"bytes"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// chunker encodes OpenAI streaming chunks, in the same shape the HTTP
// engines send, into one reused buffer.
type chunker struct {
	chat bool
	head []byte // {"id":...,"object":...,"created":...,"model":...,"choices":[
	buf  []byte
}

func newChunker(api wire.API, id, model string) *chunker {
	c := &chunker{chat: api == wire.API_API_CHAT}
	prefix, object := "cmpl-", "text_completion"
	if c.chat {
		prefix, object = "chatcmpl-", "chat.completion.chunk"
	}
	b := append(make([]byte, 0, 128), `{"id":`...)
	b = oaiformat.AppendString(b, prefix+id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = oaiformat.AppendString(b, model)
	c.head = append(b, `,"choices":[`...)
	return c
}

func (c *chunker) end(b []byte) []byte {
	c.buf = append(b, `],"usage":null}`...)
	return c.buf
}

// role is the first chunk of a chat stream.
func (c *chunker) role() []byte {
	b := append(c.buf[:0], c.head...)
	b = append(b, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`...)
	return c.end(b)
}

func (c *chunker) text(s []byte) []byte {
	b := append(c.buf[:0], c.head...)
	if c.chat {
		b = append(b, `{"index":0,"delta":{"content":`...)
		b = oaiformat.AppendString(b, string(s))
		b = append(b, `},"logprobs":null,"finish_reason":null}`...)
	} else {
		b = append(b, `{"index":0,"text":`...)
		b = oaiformat.AppendString(b, string(s))
		b = append(b, `,"logprobs":null,"finish_reason":null}`...)
	}
	return c.end(b)
}

func (c *chunker) finish(reason string) []byte {
	b := append(c.buf[:0], c.head...)
	if c.chat {
		b = append(b, `{"index":0,"delta":{},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `{"index":0,"text":"","logprobs":null,"finish_reason":`...)
	}
	b = oaiformat.AppendString(b, reason)
	b = append(b, '}')
	return c.end(b)
}

func (c *chunker) usage(prompt, completion uint32) []byte {
	b := append(c.buf[:0], c.head...)
	b = append(b, `],"usage":{"prompt_tokens":`...)
	b = strconv.AppendUint(b, uint64(prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendUint(b, uint64(completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendUint(b, uint64(prompt)+uint64(completion), 10)
	c.buf = append(b, `}}`...)
	return c.buf
}

// stopFilter applies stop strings to the decoded text on the client side,
// as vLLM's router does over gRPC: the engine stops after the token that
// completes a stop string, and the text from the stop string on is not
// sent. Up to the longest stop string less one byte is held back, since a
// stop string may span chunks.
type stopFilter struct {
	stops   []string
	hold    int
	buf     []byte
	stopped bool
}

func newStopFilter(stops []string) *stopFilter {
	f := &stopFilter{stops: stops}
	for _, s := range stops {
		f.hold = max(f.hold, len(s)-1)
	}
	return f
}

// push appends text and returns the part of the output that is decided.
func (f *stopFilter) push(dst, text []byte) []byte {
	if f.stopped {
		return dst
	}
	if len(f.stops) == 0 {
		return append(dst, text...)
	}
	f.buf = append(f.buf, text...)
	cut := -1
	for _, s := range f.stops {
		if i := bytes.Index(f.buf, []byte(s)); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		f.stopped = true
		dst = append(dst, f.buf[:cut]...)
		f.buf = f.buf[:0]
		return dst
	}
	n := len(f.buf) - f.hold
	for n > 0 && n < len(f.buf) && !utf8.RuneStart(f.buf[n]) {
		n-- // never split a character
	}
	if n <= 0 {
		return dst
	}
	dst = append(dst, f.buf[:n]...)
	f.buf = f.buf[:copy(f.buf, f.buf[n:])]
	return dst
}

// flush returns what is held back at the end of the output.
func (f *stopFilter) flush(dst []byte) []byte {
	if f.stopped {
		return dst
	}
	dst = append(dst, f.buf...)
	f.buf = f.buf[:0]
	return dst
}
