package simengine

import (
	"strconv"
	"time"

	"github.com/switchyard-ai/switchyard/oaiformat"
)

// envelope is the part every chunk or response of a request shares.
type envelope struct {
	id      string
	created int64
	model   string
}

func (e *Engine) newEnvelope(r *request) envelope {
	prefix := "cmpl-"
	if r.api == APIChat {
		prefix = "chatcmpl-"
	}
	b := make([]byte, 0, len(prefix)+len(e.idPrefix)+16)
	b = append(b, prefix...)
	b = append(b, e.idPrefix...)
	b = strconv.AppendUint(b, e.ids.Add(1), 16)
	return envelope{id: string(b), created: time.Now().Unix(), model: e.cfg.Model}
}

// appendHead appends `{"id":...,"object":...,"created":...,"model":...,`.
func (v *envelope) appendHead(b []byte, object string) []byte {
	b = append(b, `{"id":`...)
	b = oaiformat.AppendString(b, v.id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, v.created, 10)
	b = append(b, `,"model":`...)
	return oaiformat.AppendString(b, v.model)
}

// usageCounts are a request's token counts.
type usageCounts struct {
	prompt, completion int
	// cached is the prompt tokens found in the prefix cache, or -1 when
	// the engine has none: usage then has no prompt_tokens_details.
	cached int
}

func appendUsage(b []byte, u usageCounts) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.prompt+u.completion), 10)
	if u.cached >= 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(u.cached), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// chunkSink encodes OpenAI streaming chunks into one reused buffer.
type chunkSink struct {
	api          API
	n            int
	includeUsage bool
	head         []byte // `{"id":...,"model":...,"choices":[`
	buf          []byte
	emit         func([]byte) error
	onOpen       func() error
}

func (e *Engine) newChunkSink(r *request, emit func([]byte) error) *chunkSink {
	v := e.newEnvelope(r)
	object := "text_completion"
	if r.api == APIChat {
		object = "chat.completion.chunk"
	}
	head := v.appendHead(make([]byte, 0, 128), object)
	head = append(head, `,"choices":[`...)
	return &chunkSink{
		api:          r.api,
		n:            max(1, r.n),
		includeUsage: r.includeUsage,
		head:         head,
		buf:          make([]byte, 0, len(head)+128),
		emit:         emit,
	}
}

func (s *chunkSink) open() error {
	if s.onOpen != nil {
		return s.onOpen()
	}
	return nil
}

func (s *chunkSink) end(b []byte) []byte {
	b = append(b, ']')
	if s.includeUsage {
		b = append(b, `,"usage":null`...)
	}
	return append(b, '}')
}

// choice appends the head and `{"index":i,`.
func (s *chunkSink) choice(i int) []byte {
	b := append(s.buf[:0], s.head...)
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, ',')
}

// first sends a chat's role chunk, one per choice as vLLM does.
func (s *chunkSink) first() error {
	if s.api != APIChat {
		return nil
	}
	for i := range s.n {
		b := s.choice(i)
		b = append(b, `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`...)
		s.buf = s.end(b)
		if err := s.emit(s.buf); err != nil {
			return err
		}
	}
	return nil
}

func (s *chunkSink) token(i int, _, js string) error {
	b := s.choice(i)
	if s.api == APIChat {
		b = append(b, `"delta":{"content":`...)
		b = append(b, js...)
		b = append(b, `},"logprobs":null,"finish_reason":null}`...)
	} else {
		b = append(b, `"text":`...)
		b = append(b, js...)
		b = append(b, `,"logprobs":null,"finish_reason":null}`...)
	}
	s.buf = s.end(b)
	return s.emit(s.buf)
}

// stop sends choice i's finish chunk, with extra at its top level when
// no usage chunk follows.
func (s *chunkSink) stop(i int, reason string, extra []byte) error {
	b := s.choice(i)
	if s.api == APIChat {
		b = append(b, `"delta":{},"logprobs":null,"finish_reason":"`...)
	} else {
		b = append(b, `"text":"","logprobs":null,"finish_reason":"`...)
	}
	b = append(b, reason...)
	b = append(b, `"}`...)
	if s.includeUsage {
		s.buf = s.end(b)
		return s.emit(s.buf)
	}
	b = append(b, ']')
	b = append(b, extra...)
	s.buf = append(b, '}')
	return s.emit(s.buf)
}

// finish sends the usage chunk, with extra at its top level, when the
// request asked for it.
func (s *chunkSink) finish(u usageCounts, extra []byte) error {
	if !s.includeUsage {
		return nil
	}
	b := append(s.buf[:0], s.head...)
	b = append(b, `],"usage":`...)
	b = appendUsage(b, u)
	b = append(b, extra...)
	s.buf = append(b, '}')
	return s.emit(s.buf)
}

// textSink assembles a non-streaming response from the same generation.
type textSink struct {
	api     API
	v       envelope
	text    [][]byte // per choice
	reasons []string
	out     []byte
}

func (e *Engine) newTextSink(r *request) *textSink {
	return &textSink{api: r.api, v: e.newEnvelope(r), text: make([][]byte, max(1, r.n)), reasons: make([]string, max(1, r.n))}
}

func (s *textSink) open() error  { return nil }
func (s *textSink) first() error { return nil }

func (s *textSink) token(i int, text, _ string) error {
	s.text[i] = append(s.text[i], text...)
	return nil
}

func (s *textSink) stop(i int, reason string, _ []byte) error {
	s.reasons[i] = reason
	return nil
}

func (s *textSink) finish(u usageCounts, extra []byte) error {
	b := s.out[:0]
	if s.api == APIChat {
		b = s.v.appendHead(b, "chat.completion")
	} else {
		b = s.v.appendHead(b, "text_completion")
	}
	b = append(b, `,"choices":[`...)
	for i, text := range s.text {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		if s.api == APIChat {
			b = append(b, `,"message":{"role":"assistant","content":`...)
			b = oaiformat.AppendString(b, string(text))
			b = append(b, `},"logprobs":null,"finish_reason":"`...)
		} else {
			b = append(b, `,"text":`...)
			b = oaiformat.AppendString(b, string(text))
			b = append(b, `,"logprobs":null,"finish_reason":"`...)
		}
		b = append(b, s.reasons[i]...)
		b = append(b, `"}`...)
	}
	b = append(b, `],"usage":`...)
	b = appendUsage(b, u)
	b = append(b, extra...)
	s.out = append(b, '}')
	return nil
}
