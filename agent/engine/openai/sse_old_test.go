package openai

// The SSE reader of the adapter before it read through oaiformat/sse,
// kept as the reference FuzzReadSSEDifferential compares with.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sync"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// oldReader reads one SSE answer; kept in oldReaders between answers.
type oldReader struct {
	br   *bufio.Reader
	line []byte // a line longer than br's buffer
	data []byte // the current event's data
}

var oldReaders = sync.Pool{New: func() any {
	return &oldReader{br: bufio.NewReaderSize(nil, oldBufferSize)}
}}

// oldKept bounds the line and data buffers an oldReader keeps for the
// next answer: one grown by a long event is dropped.
const oldKept = 64 << 10

const oldBufferSize = 32 << 10

// oldReadSSE is the reader ReadSSE used before oaiformat/sse, with a bound on lines and events, max bytes, and the
// engine's name for the error that bound makes.
func oldReadSSE(body io.Reader, max int, engine string, emit agent.Emit) error {
	r := oldReaders.Get().(*oldReader)
	r.br.Reset(body)
	defer func() {
		r.br.Reset(nil)
		if cap(r.line) > oldKept {
			r.line = nil
		}
		if cap(r.data) > oldKept {
			r.data = nil
		}
		r.line, r.data = r.line[:0], r.data[:0]
		oldReaders.Put(r)
	}()
	for {
		line, err := r.readLine(max)
		if errors.Is(err, oldErrLine) {
			return tooLarge(engine, "line", max)
		}
		if len(line) > 0 || err == nil {
			done, ferr := r.field(bytes.TrimRight(line, "\r\n"), max, emit)
			if errors.Is(ferr, oldErrEvent) {
				return tooLarge(engine, "event", max)
			}
			if done || ferr != nil {
				return ferr
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			if bytes.Equal(r.data, oldDone) {
				return nil // "data: [DONE]" without its empty line
			}
			return &wire.Error{Code: wire.CodeEngine, Message: "engine closed the stream before [DONE]"}
		default:
			return &wire.Error{Code: wire.CodeEngine, Message: "reading engine stream: " + err.Error()}
		}
	}
}

var (
	oldErrLine  = errors.New("SSE line too long")
	oldErrEvent = errors.New("SSE event too large")
	oldDone     = []byte("[DONE]")
)

// readLine returns the next line with its line ending (none at the end of
// the body), valid until the next read; oldErrLine when it is longer
// than max bytes and its ending, which is not read to its end.
func (r *oldReader) readLine(max int) ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		if len(bytes.TrimRight(line, "\r\n")) > max {
			return nil, oldErrLine
		}
		return line, err
	}
	r.line = append(r.line[:0], line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		if len(r.line) > max+2 {
			return nil, oldErrLine
		}
		line, err = r.br.ReadSlice('\n')
		r.line = append(r.line, line...)
	}
	if len(bytes.TrimRight(r.line, "\r\n")) > max {
		return nil, oldErrLine
	}
	return r.line, err
}

// field takes one line of an event, without its ending. done reports the
// end of the stream: [DONE], or an error event (err).
func (r *oldReader) field(line []byte, max int, emit agent.Emit) (done bool, err error) {
	switch {
	case len(line) == 0:
		if len(r.data) == 0 {
			return false, nil
		}
		if bytes.Equal(r.data, oldDone) {
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
			return true, oldErrEvent
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
func (r *oldReader) eventAhead() bool {
	n := r.br.Buffered()
	if n == 0 {
		return false
	}
	p, _ := r.br.Peek(n)
	return bytes.Contains(p, []byte("\n\n")) || bytes.Contains(p, []byte("\r\n\r\n"))
}
