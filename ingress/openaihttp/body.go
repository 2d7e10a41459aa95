package openaihttp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// DefaultBodyReadTimeout bounds reading one request body: a 4 MiB body on a
// 1 Mbit/s link takes about 32 s.
const DefaultBodyReadTimeout = 60 * time.Second

// readBody reads a request body within the body read timeout and the size
// bound. The deadline is set per request through the ResponseController
// rather than as the server's ReadTimeout: that one stays on the connection
// while the handler runs, and net/http's background read, which notices a
// client going away, would then cancel long SSE streams. Once the body is
// in, the deadline is cleared for that same reason.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	rc := http.NewResponseController(w)
	timed := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout)) == nil
	body, err := readAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody), r.ContentLength, s.cfg.MaxBody)
	if timed {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err == nil {
		return body, nil
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body larger than %d bytes", s.cfg.MaxBody), Type: "invalid_request_error", Code: strp("body_too_large")}
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The connection cannot be trusted for another request: net/http
		// closes it after this answer.
		w.Header().Set("Connection", "close")
		return nil, &apiError{Status: http.StatusRequestTimeout, Message: fmt.Sprintf("request body not received within %s (read %d bytes); the broker's --read-body-timeout sets this bound", s.cfg.BodyReadTimeout, len(body)), Type: "invalid_request_error", Code: strp("body_timeout")}
	}
	return nil, invalid("reading request body: "+err.Error(), "", "bad_body")
}

// readAll is io.ReadAll with the buffer sized once from the declared
// length (one byte more, to see the end), when there is one within max.
func readAll(r io.Reader, declared, max int64) ([]byte, error) {
	if declared <= 0 || declared > max {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, declared+1)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			// Longer than declared (net/http stops at Content-Length, so
			// only a reader that does not): the rest as io.ReadAll would.
			rest, err := io.ReadAll(r)
			return append(b, rest...), err
		}
	}
}
