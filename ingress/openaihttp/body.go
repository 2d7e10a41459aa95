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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
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
