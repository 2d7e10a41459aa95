// Package sse reads server-sent events (text/event-stream), the framing of
// every OpenAI stream: an engine's answer read by the agent, a server's
// read by the load generator and the benchmark runner. It is the one SSE
// reader of the project, a leaf that imports only the standard library.
//
// The format is WHATWG's: lines end at \n (a \r before it is dropped; a
// lone \r is not a line end), a line "name: value" is a field (one space
// after the colon is dropped), "data" lines are joined with \n, "event"
// names the event's type, other fields are ignored, a line starting with
// a colon is a comment, and an empty line ends an event, which is
// dispatched if it had a data line.
//
// The reader is bounded: a line and an event's data are each at most the
// reader's max bytes, so an endless or oversized stream costs at most
// that, and reading allocates nothing once its buffers have grown to the
// longest event.
//
// openai-go's ssestream reads the same format, but through a
// bufio.Scanner whose line bound is fixed at 32 MiB, with a new buffer for
// each event's data, no view of comments, and no sight of what is already
// read ahead (what lets the agent send a burst of events as one message):
// the hot path of the agent needs all four.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// The errors of a stream that breaks the reader's bound. Neither is
// recoverable: the reader stops where the bound was crossed.
var (
	ErrLineTooLong   = errors.New("sse: line too long")
	ErrEventTooLarge = errors.New("sse: event too large")
)

// DefaultBufferSize is the size of the buffer a Reader reads through: a
// burst of events that arrived together is read together.
const DefaultBufferSize = 32 << 10

// keptBuffer bounds the line and data buffers Reset keeps for the next
// stream: one grown by a long event is dropped.
const keptBuffer = 64 << 10

// Event is one event, or a comment. Its slices are valid until the next
// call of Next.
type Event struct {
	// Type is the value of the event's last "event" field; empty for the
	// default type ("message").
	Type []byte
	// Data is the event's data lines joined with \n; for a comment, the
	// text after its colon.
	Data []byte
	// Comment is set for a comment line, which Next returns only from a
	// Reader that shows comments (ShowComments): a caller that counts an
	// engine's keep-alives as progress sees them.
	Comment bool
}

// Reader reads events from a stream.
type Reader struct {
	br       *bufio.Reader
	max      int
	comments bool
	line     []byte // a line longer than br's buffer
	data     []byte // the current event's data
	typ      []byte // the current event's type
	hasData  bool
	sent     bool // the current event was returned: the next starts afresh
}

// NewReader returns a Reader of body that bounds lines and events at max
// bytes.
func NewReader(body io.Reader, max int) *Reader {
	r := &Reader{br: bufio.NewReaderSize(body, DefaultBufferSize)}
	r.Reset(body, max)
	return r
}

// Reset makes r read a new stream, body, with the bound max, keeping its
// buffers (those grown past a long event are dropped). Reset(nil, 0)
// releases body.
func (r *Reader) Reset(body io.Reader, max int) {
	r.br.Reset(body)
	r.max = max
	r.comments = false
	if cap(r.line) > keptBuffer {
		r.line = nil
	}
	if cap(r.data) > keptBuffer {
		r.data = nil
	}
	r.line, r.data, r.typ, r.hasData, r.sent = r.line[:0], r.data[:0], r.typ[:0], false, false
}

// ShowComments makes Next return comment lines as events with Comment set.
func (r *Reader) ShowComments() { r.comments = true }

// Next returns the next event. At the end of the stream it returns io.EOF;
// if the stream ended inside an event that had data (no empty line after
// it), it returns that event with io.ErrUnexpectedEOF, so that a caller
// may accept a last "data: [DONE]" whose empty line never came. A line or
// event over the bound is ErrLineTooLong or ErrEventTooLarge; another
// read error is returned as it is.
func (r *Reader) Next() (Event, error) {
	if r.sent {
		r.data, r.typ, r.hasData, r.sent = r.data[:0], r.typ[:0], false, false
	}
	for {
		line, err := r.readLine()
		if errors.Is(err, ErrLineTooLong) {
			return Event{}, err
		}
		if len(line) > 0 || err == nil {
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
			if len(line) == 0 {
				if r.hasData {
					r.sent = true
					return Event{Type: r.typ, Data: r.data}, nil
				}
				r.typ = r.typ[:0] // an event without data is not dispatched
				continue
			}
			if line[0] == ':' {
				if r.comments && err == nil {
					return Event{Data: bytes.TrimPrefix(line[1:], []byte(" ")), Comment: true}, nil
				}
			} else if ferr := r.field(line); ferr != nil {
				return Event{}, ferr
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			if r.hasData {
				r.sent = true
				return Event{Type: r.typ, Data: r.data}, io.ErrUnexpectedEOF
			}
			return Event{}, io.EOF
		default:
			return Event{}, err
		}
	}
}

// field takes one field line, without its ending.
func (r *Reader) field(line []byte) error {
	name, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		name, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		n := len(value)
		if r.hasData {
			n++
		}
		if len(r.data)+n > r.max {
			return ErrEventTooLarge
		}
		if r.hasData {
			r.data = append(r.data, '\n')
		}
		r.data = append(r.data, value...)
		r.hasData = true
	case "event":
		r.typ = append(r.typ[:0], value...)
	}
	// id, retry and unknown fields carry nothing a reader here uses.
	return nil
}

// readLine returns the next line with its line ending (none at the end of
// the stream), valid until the next read; ErrLineTooLong when it is longer
// than max bytes and its ending, which is not read to its end.
func (r *Reader) readLine() ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		if len(bytes.TrimRight(line, "\r\n")) > r.max {
			return nil, ErrLineTooLong
		}
		return line, err
	}
	r.line = append(r.line[:0], line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		if len(r.line) > r.max+2 {
			return nil, ErrLineTooLong
		}
		line, err = r.br.ReadSlice('\n')
		r.line = append(r.line, line...)
	}
	if len(bytes.TrimRight(r.line, "\r\n")) > r.max {
		return nil, ErrLineTooLong
	}
	return r.line, err
}

// EventAhead reports whether what is read but not yet returned holds the
// end of another event: the next one can be taken without waiting on the
// stream.
func (r *Reader) EventAhead() bool {
	n := r.br.Buffered()
	if n == 0 {
		return false
	}
	p, _ := r.br.Peek(n)
	return bytes.Contains(p, []byte("\n\n")) || bytes.Contains(p, []byte("\r\n\r\n"))
}
