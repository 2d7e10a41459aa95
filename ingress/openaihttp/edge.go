package openaihttp

import (
	"io"
	"net/http"
	"time"
)

// Edge wraps the broker's whole HTTP handler, the API key check included,
// and bounds what a request may cost before and while its body is read:
//
//   - An HTTP/1 response to a request whose body came in chunked transfer
//     coding closes its connection. net/http reads such a body by its
//     chunks and drops a Content-Length sent beside Transfer-Encoding
//     before any handler sees the request, so a request that carries both
//     (RFC 9112 section 6.1: a smuggling attempt, after which the
//     connection must be closed) cannot be told from one that carries
//     Transfer-Encoding alone; both are served by their chunks, and
//     nothing more is read from their connection.
//   - A request's body must arrive within the body read timeout from when
//     its head was read, whether a handler reads it or net/http drains it.
//     The deadline is the connection's read deadline, cleared once the body
//     was read to its end (net/http's background read, which notices a
//     client hanging up, would otherwise end long streams when it fires)
//     and never after it fired.
//   - An HTTP/1 response to a request whose body was not read to its end
//     (the 401 of a missing key, a 405, a 413, a GET with a body) closes
//     its connection at once: net/http would otherwise read the rest of
//     the body before answering or closing, which a client trickling it
//     could stretch to the body read timeout.
//   - Every answer must be written within the write timeout from when it
//     starts (its status line), so that a client that does not read (one
//     pipelining requests and never reading the answers included) holds
//     its connection no longer than that; a stream moves the deadline on
//     with each write (the stream write timeout). On HTTP/1 the deadline is
//     also set when the request's head has been read, for what net/http
//     writes on its behalf before its answer (100 Continue); HTTP/2 ends a
//     stream when its deadline passes, written to or not, so there it is
//     set only once the answer starts.
//
// Nothing here reads a body: a request refused before its handler reads
// it costs no more memory than net/http's buffers, and gets no
// "100 Continue".
func (s *Server) Edge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if s.cfg.WriteTimeout > 0 {
			if r.ProtoMajor == 1 {
				_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			}
			w = &deadlineWriter{ResponseWriter: w, rc: rc, timeout: s.cfg.WriteTimeout}
		}
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		b := &edgeBody{ReadCloser: r.Body, rc: rc}
		b.timed = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout)) == nil
		r.Body = b
		if r.ProtoMajor != 1 {
			// HTTP/2 bounds an unread body with the stream's flow
			// control; closing the connection would end its other streams.
			next.ServeHTTP(w, r)
			return
		}
		ew := &edgeWriter{ResponseWriter: w, body: b, chunked: len(r.TransferEncoding) > 0}
		next.ServeHTTP(ew, r)
		if ew.chunked && !ew.started {
			w.Header().Set("Connection", "close")
		}
		if !b.eof {
			if !ew.started {
				w.Header().Set("Connection", "close")
			}
			// The connection closes after this answer; net/http would
			// still read up to 256 KiB of the body first, which a client
			// trickling it stretches to the body read timeout.
			_ = rc.SetReadDeadline(time.Now())
		}
	})
}

// edgeBody is a request body that clears the connection's read deadline
// once the body was read to its end, unless a read failed (the deadline
// fired, or the client went away). Only the handler's goroutine reads it.
type edgeBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	timed  bool // the read deadline is set
	eof    bool
	failed bool
}

func (b *edgeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		if !b.eof && !b.failed && b.timed {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
		b.eof = true
	case err != nil:
		b.failed = true
	}
	return n, err
}

// edgeWriter closes the connection after its response when the request's
// body was not read to its end when the response started, or came in
// chunks (see Edge).
type edgeWriter struct {
	http.ResponseWriter
	body    *edgeBody
	chunked bool
	started bool
}

func (w *edgeWriter) WriteHeader(status int) {
	if !w.started && status >= 200 {
		w.started = true
		if !w.body.eof || w.chunked {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *edgeWriter) Write(p []byte) (int, error) {
	if !w.started {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach net/http's writer (flushes,
// deadlines).
func (w *edgeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// deadlineWriter sets the connection's (or HTTP/2 stream's) write deadline
// to timeout from when its response starts.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
}

func (w *deadlineWriter) WriteHeader(status int) {
	if !w.started && status >= 200 {
		w.started = true
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	if !w.started {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
