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

// readBody reads a request body within the size bound; the body read
// timeout is the connection's read deadline, which Edge sets. The buffer
// grows with the bytes that arrive, never sized from the declared
// Content-Length: a client declares what it likes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	// http.MaxBytesReader tells net/http's own writer that the limit was
	// hit, which then closes the connection only once the client had time
	// to read the 413 (it may still be sending): not through a wrapper.
	body, err := io.ReadAll(http.MaxBytesReader(innermost(w), r.Body, s.cfg.MaxBody))
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

// innermost unwraps w (see http.ResponseController) down to the writer
// net/http made.
func innermost(w http.ResponseWriter) http.ResponseWriter {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}
