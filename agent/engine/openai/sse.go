package openai

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// sseBufferSize is the size of the reader an SSE answer is read through,
// and of the connection's own read buffer: a burst of events that reaches
// the agent together is read together.
const sseBufferSize = 32 << 10

// sseReader reads one SSE answer; kept in sseReaders between answers.
type sseReader struct {
	br   *bufio.Reader
	line []byte // a line longer than br's buffer
	data []byte // the current event's data
}

var sseReaders = sync.Pool{New: func() any {
	return &sseReader{br: bufio.NewReaderSize(nil, sseBufferSize)}
}}

// keptBuffer bounds the line and data buffers an sseReader keeps for the
// next answer: one grown by a long event is dropped.
const keptBuffer = 64 << 10

// ReadSSE calls emit with the data of each server-sent event until
// "data: [DONE]" or the end of the body, as the adapter reads an engine's
// answer (a line or event longer than DefaultMaxEvent ends it with an
// error). Lines end at \n (a \r before it is dropped), "data:" lines (one
// optional space after the colon) are joined with \n, other fields and
// comments are skipped, and an empty line ends an event. An error event
// (an object with an "error" member, as vLLM sends mid-stream) ends the
// stream with that error, and so does a body that ends before [DONE].
// emit's more is true when the next whole event is already read, so a
// burst of events that arrived together can travel on as one message.
func ReadSSE(body io.Reader, emit agent.Emit) error {
	return readSSE(body, DefaultMaxEvent, "", emit)
}

// readSSE is ReadSSE with a bound on lines and events, max bytes, and the
// engine's name for the error that bound makes.
func readSSE(body io.Reader, max int, engine string, emit agent.Emit) error {
	r := sseReaders.Get().(*sseReader)
	r.br.Reset(body)
	defer func() {
		r.br.Reset(nil)
		if cap(r.line) > keptBuffer {
			r.line = nil
		}
		if cap(r.data) > keptBuffer {
			r.data = nil
		}
		r.line, r.data = r.line[:0], r.data[:0]
		sseReaders.Put(r)
	}()
	for {
		line, err := r.readLine(max)
		if errors.Is(err, errLineTooLong) {
			return tooLarge(engine, "line", max)
		}
		if len(line) > 0 || err == nil {
			done, ferr := r.field(bytes.TrimRight(line, "\r\n"), max, emit)
			if errors.Is(ferr, errEventTooLarge) {
				return tooLarge(engine, "event", max)
			}
			if done || ferr != nil {
				return ferr
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			if bytes.Equal(r.data, doneData) {
				return nil // "data: [DONE]" without its empty line
			}
			return &wire.Error{Code: wire.CodeEngine, Message: "engine closed the stream before [DONE]"}
		default:
			return &wire.Error{Code: wire.CodeEngine, Message: "reading engine stream: " + err.Error()}
		}
	}
}

var (
	errLineTooLong   = errors.New("SSE line too long")
	errEventTooLarge = errors.New("SSE event too large")
	doneData         = []byte("[DONE]")
)

// tooLarge is the error of an engine answer that breaks the bound on an
// SSE line or event: not retryable, since any engine would answer the
// same request alike, and the stream cannot carry it.
func tooLarge(engine, what string, max int) *wire.Error {
	msg := fmt.Sprintf("SSE %s exceeds %d bytes", what, max)
	if what == "answer" {
		msg = fmt.Sprintf("answer exceeds %d bytes", max)
	}
	if engine != "" {
		msg = "engine " + engine + ": " + msg
	}
	return &wire.Error{Code: wire.CodeEngineOutputTooLarge, Message: msg}
}

// readLine returns the next line with its line ending (none at the end of
// the body), valid until the next read; errLineTooLong when it is longer
// than max bytes and its ending, which is not read to its end.
func (r *sseReader) readLine(max int) ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		if len(bytes.TrimRight(line, "\r\n")) > max {
			return nil, errLineTooLong
		}
		return line, err
	}
	r.line = append(r.line[:0], line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		if len(r.line) > max+2 {
			return nil, errLineTooLong
		}
		line, err = r.br.ReadSlice('\n')
		r.line = append(r.line, line...)
	}
	if len(bytes.TrimRight(r.line, "\r\n")) > max {
		return nil, errLineTooLong
	}
	return r.line, err
}

// field takes one line of an event, without its ending. done reports the
// end of the stream: [DONE], or an error event (err).
func (r *sseReader) field(line []byte, max int, emit agent.Emit) (done bool, err error) {
	switch {
	case len(line) == 0:
		if len(r.data) == 0 {
			return false, nil
		}
		if bytes.Equal(r.data, doneData) {
			return true, nil
		}
		if e := eventError(r.data); e != nil {
			return true, e
		}
		if err := emit(r.data, r.eventAhead()); err != nil {
			return true, err
		}
		r.data = r.data[:0]
	case bytes.HasPrefix(line, []byte("data:")):
		v := bytes.TrimPrefix(line[5:], []byte(" "))
		if len(r.data) > 0 {
			r.data = append(r.data, '\n')
		}
		if len(r.data)+len(v) > max {
			return true, errEventTooLarge
		}
		r.data = append(r.data, v...)
	default:
		// event:, id:, retry: and comments carry nothing we relay.
	}
	return false, nil
}

// eventAhead reports whether what is read but not yet parsed holds the end
// of another event: the next one can be taken without waiting on the
// engine.
func (r *sseReader) eventAhead() bool {
	n := r.br.Buffered()
	if n == 0 {
		return false
	}
	p, _ := r.br.Peek(n)
	return bytes.Contains(p, []byte("\n\n")) || bytes.Contains(p, []byte("\r\n\r\n"))
}
