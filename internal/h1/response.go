package h1

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/http/httpguts"
)

// response is the http.ResponseWriter of one request served here. It
// writes to the connection itself, with no buffered writer between: a
// response that is flushed goes out chunked, one write(2) per flush, and
// its end with the handler's last bytes; one that is never flushed goes
// out whole when the handler returns, with its length. Like net/http's, it
// belongs to the handler's goroutine.
type response struct {
	c      *conn
	header http.Header
	status int
	// body holds the body bytes not yet written: unframed until the head
	// goes out, framed as chunks after.
	body     []byte
	wroteHdr bool // the status is set
	headOut  bool // the head went out (chunked from there on)
	closeAft bool // the connection ends after this response
	done     bool // the handler returned
	err      error
}

// maxUnflushed bounds what a response that is never flushed keeps before
// it goes out chunked anyway.
const maxUnflushed = 64 << 10

var (
	_ http.ResponseWriter = (*response)(nil)
	_ http.Flusher        = (*response)(nil)
)

// errHandlerDone is a write after the handler returned.
var errHandlerDone = errors.New("h1: write after the handler returned")

func (w *response) Header() http.Header { return w.header }

// WriteHeader sets the status; the head goes out with the first flush or
// at the end. Interim (1xx) statuses are not sent.
func (w *response) WriteHeader(code int) {
	if w.wroteHdr || w.done {
		return
	}
	if code < 100 || code > 999 {
		panic("h1: invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 {
		return
	}
	w.status, w.wroteHdr = code, true
	if httpguts.HeaderValuesContainsToken(w.header["Connection"], "close") {
		w.closeAft = true
	}
}

func (w *response) Write(p []byte) (int, error) {
	if w.done {
		return 0, errHandlerDone
	}
	if !w.wroteHdr {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if w.headOut {
		w.body = appendChunk(w.body, p)
		return len(p), nil
	}
	w.body = append(w.body, p...)
	if len(w.body) > maxUnflushed {
		if err := w.FlushError(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush sends what is written so far.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError is Flush with the write's error (see http.ResponseController).
func (w *response) FlushError() error {
	if w.done {
		return errHandlerDone
	}
	if !w.wroteHdr {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	if !w.headOut {
		out := w.c.appendHead(w.c.out[:0], w, -1)
		out = appendChunk(out, w.body)
		w.c.keepOut(out)
		w.headOut = true
		w.body = w.body[:0]
		return w.write(out)
	}
	if len(w.body) == 0 {
		return nil
	}
	err := w.write(w.body)
	w.body = w.body[:0]
	return err
}

// write sends b.
func (w *response) write(b []byte) error {
	_, err := w.c.nc.Write(b)
	if err != nil {
		w.err, w.closeAft = err, true
	}
	return err
}

// ErrWouldBlock is FlushNow's answer when the connection could not take
// everything now: the rest waits in the response for the handler's next
// Flush.
var ErrWouldBlock = errors.New("h1: write would block")

// AppendNow and FlushNow let a relay that receives a stream's events on a
// goroutine of its own write them there, saving a wake-up of the handler
// per event: AppendNow adds p to the body (as one chunk once the head is
// out) without writing; FlushNow writes what the body holds with one
// write(2) that does not wait, the head first if the status is set
// (WriteHeader) and the head not out yet, as Flush would. Either may be
// called from any goroutine while the handler's does not use the
// response (the caller's synchronization says when). FlushNow returns
// ErrWouldBlock when no status is set yet, the connection's send buffer is
// full (a client that reads slowly) or it cannot write without waiting
// (TLS): the rest is kept, and the handler's next Flush writes it, in
// order. Any other error is the connection's, and the response's from
// then.
func (w *response) AppendNow(p []byte) {
	switch {
	case w.done || len(p) == 0:
	case w.headOut:
		w.body = appendChunk(w.body, p)
	default:
		w.body = append(w.body, p...) // unframed until the head goes
	}
}

// FlushNow: see AppendNow.
func (w *response) FlushNow() error {
	switch {
	case w.err != nil:
		return w.err
	case w.done:
		return errHandlerDone
	case len(w.body) == 0 && (w.headOut || !w.wroteHdr):
		return nil
	case w.c.rc == nil || !w.wroteHdr:
		return ErrWouldBlock
	case !w.headOut:
		// The head and what the body holds, as one write and one chunk;
		// what the connection does not take is kept, framed, for the
		// handler.
		out := w.c.appendHead(w.c.out[:0], w, -1)
		out = appendChunk(out, w.body)
		w.headOut = true
		n, err := w.writeNow(out)
		w.body = append(w.body[:0], out[n:]...)
		w.c.keepOut(out)
		if err == nil && len(w.body) > 0 {
			err = ErrWouldBlock
		}
		return err
	}
	n, err := w.writeNow(w.body)
	w.body = w.body[:copy(w.body, w.body[n:])]
	if err == nil && len(w.body) > 0 {
		err = ErrWouldBlock
	}
	return err
}

// writeNow makes one write(2) of b that does not wait, and returns how
// much of b went out.
func (w *response) writeNow(b []byte) (int, error) {
	n, err := w.c.rw.tryWrite(w.c.rc, b)
	if err != nil {
		w.err, w.closeAft = err, true
		return 0, err
	}
	return n, nil
}

// WritesNow reports whether FlushNow can write at all on this connection
// (plain TCP on a unix system): over TLS it only ever keeps what it is
// given for the handler.
func (w *response) WritesNow() bool { return w.c.rc != nil }

// SetWriteDeadline bounds the writes of this response.
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.nc.SetWriteDeadline(t) }

// SetReadDeadline does nothing: the body is read before the handler runs.
func (w *response) SetReadDeadline(time.Time) error { return nil }

// finish ends the response when the handler returns: what is left goes
// out in one write, with the chunked body's end, or whole with its length.
func (w *response) finish() error {
	if !w.wroteHdr {
		w.WriteHeader(http.StatusOK)
	}
	w.done = true
	if w.err != nil {
		return w.err
	}
	if w.headOut {
		w.body = append(w.body, "0\r\n\r\n"...)
		return w.write(w.body)
	}
	out := w.c.appendHead(w.c.out[:0], w, len(w.body))
	out = append(out, w.body...)
	w.c.keepOut(out)
	return w.write(out)
}

// appendChunk appends p as one chunk of a chunked body.
func appendChunk(b, p []byte) []byte {
	if len(p) == 0 {
		return b
	}
	b = strconv.AppendUint(b, uint64(len(p)), 16)
	b = append(b, "\r\n"...)
	b = append(b, p...)
	return append(b, "\r\n"...)
}
