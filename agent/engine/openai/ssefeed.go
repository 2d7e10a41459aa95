package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// sseFeed decodes an engine's SSE answer from the bytes pushed to it, read
// by read: the body's HTTP/1.1 framing (chunked, a length, or the
// connection's end), then the events, each given to emit as it completes.
// A reader that pushes what it reads, instead of a parser that pulls
// through layers of buffered readers, lets the adapter read the socket
// the way an event loop does (see stream.readSSE).
//
// The events are read as ReadSSE always read them: lines end at \n (a \r
// before it is dropped), "data:" lines (one optional space after the
// colon) are joined with \n, other fields and comments are skipped, an
// empty line ends an event, "data: [DONE]" ends the stream, and an event
// whose data is an object with an "error" member ends it with that error.
type sseFeed struct {
	framing framing
	cs      chunkState
	left    uint64 // framed by length: body bytes left; chunked: the current chunk's
	hdr     []byte // a chunk-size or trailer line split across pushes
	budget  int    // what the trailer section may still take
	excess  int64  // framing overhead charged (see framingLine)
	// trailers counts the trailer section's fields so far.
	trailers int
	// bodyDone is set once the body's end (the last chunk and its
	// trailers, or its length) has been read: the connection is then at
	// the next answer's first byte.
	bodyDone bool
	// pastBody is set when bytes came after the body's end: the
	// connection is not at an answer's start any more.
	pastBody bool

	line []byte // an event line split across pushes
	data []byte // the current event's data
	// sseDone is set at [DONE] or a stream-ending error: later events are
	// not emitted (the framing still reads to the body's end).
	sseDone bool
}

// framing is how an answer's body is delimited.
type framing uint8

const (
	framedByClose  framing = iota // to the connection's end (or an already decoded body)
	framedByChunks                // HTTP/1.1 chunked
	framedByLength                // Content-Length
)

type chunkState uint8

const (
	chunkSize    chunkState = iota // reading a chunk-size line
	chunkData                      // left bytes of data to go
	chunkDataCR                    // the CR after a chunk's data
	chunkDataLF                    // the LF after it
	chunkTrailer                   // reading the trailer section's lines
)

// maxChunkLine bounds a chunk-size line, as net/http's chunked reader does.
const maxChunkLine = 4096

var (
	errChunked = errors.New("malformed chunked encoding")
	// errPastBody is data after the end of an answer's body: the
	// connection cannot carry another request.
	errPastBody = errors.New("engine sent data after the end of its answer")
)

func newFeed(f framing, length int64) sseFeed {
	s := sseFeed{framing: f, budget: maxHead}
	if f == framedByLength {
		s.left = uint64(length)
		s.bodyDone = length == 0
	}
	return s
}

// push decodes p, which it may overwrite, and emits the events it
// completes. done reports the end of the stream: [DONE], or an error
// event, which is err. A framing error is err too; the events before it
// are emitted first.
func (f *sseFeed) push(p []byte, emit agent.Emit) (done bool, err error) {
	payload, ferr := f.unframe(p)
	if errors.Is(ferr, errPastBody) {
		// The body ended before these bytes: the stream ends with it, and
		// the connection cannot be used again.
		f.pastBody, ferr = true, nil
	}
	if !f.sseDone {
		if err := f.events(payload, emit); err != nil || f.sseDone {
			return true, err
		}
	}
	if ferr != nil {
		if f.sseDone {
			return true, nil // the stream ended well; the connection goes
		}
		return true, f.broken(emit, ferr)
	}
	if f.bodyDone && !f.sseDone {
		// The body ended: an event left without its empty line still counts.
		return true, f.end(emit)
	}
	return f.sseDone, nil
}

// eof is the connection's end: the body's end when nothing frames it,
// else a cut.
func (f *sseFeed) eof(emit agent.Emit) error {
	if f.sseDone {
		return nil
	}
	if f.framing == framedByClose {
		f.bodyDone = true
		return f.end(emit)
	}
	// Its framing says more was to come.
	return f.broken(emit, io.ErrUnexpectedEOF)
}

// broken ends the stream at err, a read or framing error. A line cut
// short by it is read as a line first, as the pulling reader read the
// part of a line before an error: it may end an event (or the stream).
func (f *sseFeed) broken(emit agent.Emit, err error) error {
	if f.sseDone {
		return nil
	}
	if len(f.line) > 0 {
		line := bytes.TrimRight(f.line, "\r\n")
		f.line = f.line[:0]
		if ferr := f.field(line, nil, emit); ferr != nil || f.sseDone {
			f.sseDone = true
			return ferr
		}
	}
	f.sseDone = true
	return &wire.Error{Code: wire.CodeEngine, Message: "reading engine stream: " + err.Error()}
}

// end is the body's end: a last line without its newline is read as a
// line, and the stream must have reached [DONE].
func (f *sseFeed) end(emit agent.Emit) error {
	if len(f.line) > 0 {
		line := bytes.TrimRight(f.line, "\r\n")
		f.line = f.line[:0]
		if err := f.field(line, nil, emit); err != nil || f.sseDone {
			return err
		}
	}
	f.sseDone = true
	if bytes.Equal(f.data, doneData) {
		return nil
	}
	return &wire.Error{Code: wire.CodeEngine, Message: "engine closed the stream before [DONE]"}
}

var doneData = []byte("[DONE]")

// events parses the body bytes in p (see sseFeed). Only f.data and f.line
// outlive the call: they copy what they keep of p.
func (f *sseFeed) events(p []byte, emit agent.Emit) error {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			f.line = append(f.line, p...)
			return nil
		}
		line := p[:i]
		p = p[i+1:]
		if len(f.line) > 0 {
			f.line = append(f.line, line...)
			line = f.line
		}
		err := f.field(bytes.TrimRight(line, "\r\n"), p, emit)
		f.line = f.line[:0]
		if err != nil || f.sseDone {
			return err
		}
	}
	return nil
}

// field takes one line of an event; rest is what follows it in the same
// push (to tell emit whether the next event is at hand).
func (f *sseFeed) field(line, rest []byte, emit agent.Emit) error {
	switch {
	case len(line) == 0:
		if len(f.data) == 0 {
			return nil
		}
		if bytes.Equal(f.data, doneData) {
			f.sseDone = true
			return nil
		}
		if e := eventError(f.data); e != nil {
			f.sseDone = true
			return e
		}
		if err := emit(f.data, eventAhead(rest)); err != nil {
			f.sseDone = true
			return err
		}
		f.data = f.data[:0]
	case bytes.HasPrefix(line, []byte("data:")):
		v := bytes.TrimPrefix(line[5:], []byte(" "))
		if len(f.data) > 0 {
			f.data = append(f.data, '\n')
		}
		f.data = append(f.data, v...)
	default:
		// event:, id:, retry: and comments carry nothing we relay.
	}
	return nil
}

// eventAhead reports whether p holds the end of another event: the next
// chunk can be taken without waiting on the engine.
func eventAhead(p []byte) bool {
	return bytes.Contains(p, []byte("\n\n")) || bytes.Contains(p, []byte("\r\n\r\n"))
}

// unframe strips the body's framing from p in place and returns the body
// bytes it held: an error ends the body (the bytes before it are
// returned).
func (f *sseFeed) unframe(p []byte) ([]byte, error) {
	switch f.framing {
	case framedByClose:
		return p, nil
	case framedByLength:
		if f.bodyDone {
			return nil, errPastBody
		}
		if uint64(len(p)) > f.left {
			n := f.left
			f.left, f.bodyDone = 0, true
			return p[:n], errPastBody
		}
		f.left -= uint64(len(p))
		f.bodyDone = f.left == 0
		return p, nil
	}
	// Chunked: the data parts are moved down over the framing, so out
	// never passes the byte being read.
	out := p[:0]
	for len(p) > 0 {
		if f.bodyDone {
			return out, errPastBody
		}
		switch f.cs {
		case chunkData:
			n := min(uint64(len(p)), f.left)
			out = append(out, p[:n]...)
			p = p[n:]
			if f.left -= n; f.left == 0 {
				f.cs = chunkDataCR
			}
		case chunkDataCR, chunkDataLF:
			want := byte('\r')
			if f.cs == chunkDataLF {
				want = '\n'
			}
			if p[0] != want {
				return out, errChunked
			}
			p = p[1:]
			if f.cs++; f.cs > chunkDataLF {
				f.cs = chunkSize
			}
		case chunkSize, chunkTrailer:
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				if len(f.hdr)+len(p) > maxChunkLine && f.cs == chunkSize || len(f.hdr)+len(p) > f.budget {
					return out, fmt.Errorf("%w: line too long", errChunked)
				}
				f.hdr = append(f.hdr, p...)
				return out, nil
			}
			line := p[:i+1]
			p = p[i+1:]
			if len(f.hdr) > 0 {
				f.hdr = append(f.hdr, line...)
				line = f.hdr
			}
			err := f.framingLine(line)
			f.hdr = f.hdr[:0]
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// framingLine takes one whole line (with its LF) of the chunked framing: a
// chunk size, read as net/http's chunked reader reads it, or a line of the
// trailer section, read as a header line and dropped (nothing the adapter
// reads travels there).
func (f *sseFeed) framingLine(line []byte) error {
	if f.cs == chunkTrailer {
		if f.budget -= len(line); f.budget < 0 {
			return fmt.Errorf("%w: trailer section longer than %d bytes", errChunked, maxHead)
		}
		line = line[:len(line)-1]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		if len(line) == 0 {
			f.bodyDone = true
			return nil
		}
		if !validTrailer(line, f.trailers == 0) {
			return fmt.Errorf("%w: trailer line %q", errChunked, line)
		}
		f.trailers++
		return nil
	}
	if len(line) > maxChunkLine {
		return fmt.Errorf("%w: line too long", errChunked)
	}
	// CRLF only, and no CR before it.
	if len(line) < 2 || bytes.IndexByte(line, '\r') != len(line)-2 {
		return fmt.Errorf("%w: line %q", errChunked, line)
	}
	line = line[:len(line)-2]
	// Overhead beyond 16 bytes a chunk and twice its data is charged, and
	// too much of it ends the body: a sender cannot stretch a small body
	// with long extensions (net/http's rule).
	f.excess += int64(len(line)) + 2
	size, _, _ := bytes.Cut(bytes.TrimRight(line, " \t"), []byte(";")) // extensions are dropped
	n, err := parseChunkSize(size)
	if err != nil {
		return err
	}
	f.excess = max(f.excess-16-2*int64(min(n, 1<<40)), 0)
	if f.excess > 16<<10 {
		return fmt.Errorf("%w: too much non-data", errChunked)
	}
	if n == 0 {
		f.cs = chunkTrailer
		return nil
	}
	f.left, f.cs = n, chunkData
	return nil
}

// parseChunkSize reads a chunk size: hex digits, at most 16 of them.
func parseChunkSize(v []byte) (uint64, error) {
	if len(v) == 0 || len(v) > 16 {
		return 0, fmt.Errorf("%w: chunk size %q", errChunked, v)
	}
	var n uint64
	for _, b := range v {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b = b - 'a' + 10
		case 'A' <= b && b <= 'F':
			b = b - 'A' + 10
		default:
			return 0, fmt.Errorf("%w: chunk size %q", errChunked, v)
		}
		n = n<<4 | uint64(b)
	}
	return n, nil
}
