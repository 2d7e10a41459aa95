package openaihttp

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/switchyard-ai/switchyard/batch"
	"github.com/switchyard-ai/switchyard/broker"
)

var _ batch.Runner = (*Server)(nil)

type batchLineKey struct{}

// lineClass is the work class of r: batch for a batch line, whose
// deadline is its context's (the batch's expiry) and a second, so that the
// context's end decides a line cut off by the window (not run, no answer
// recorded), not the broker's timer (a 504 answer).
func lineClass(r *http.Request) (broker.Class, time.Time) {
	if r.Context().Value(batchLineKey{}) == nil {
		return broker.ClassInteractive, time.Time{}
	}
	d, ok := r.Context().Deadline()
	if !ok {
		return broker.ClassBatch, time.Time{}
	}
	return broker.ClassBatch, d.Add(time.Second)
}

// RunLine runs one batch line through its endpoint's handler, in-process:
// the same validation, answer and error as over HTTP, as a batch-class
// request whose deadline is ctx's (the batch's expiry).
func (s *Server) RunLine(ctx context.Context, endpoint string, body []byte, requestID string) (int, []byte) {
	var h http.HandlerFunc
	switch endpoint {
	case "/v1/chat/completions":
		h = s.completions(chatAPI)
	case "/v1/completions":
		h = s.completions(completionAPI)
	case "/v1/embeddings":
		h = s.embeddings
	default:
		return http.StatusNotFound, []byte(`{"error":{"message":"no route POST ` + endpoint + `","type":"invalid_request_error","param":null,"code":"not_found"}}`)
	}
	req, err := http.NewRequestWithContext(context.WithValue(ctx, batchLineKey{}, true), http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return http.StatusBadRequest, []byte(`{"error":{"message":"bad line","type":"invalid_request_error","param":null,"code":"invalid_request"}}`)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", requestID)
	rec := &lineRecorder{header: http.Header{}}
	h(rec, req)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return rec.status, bytes.TrimSpace(rec.body.Bytes())
}

// lineRecorder is the response writer of a batch line: it keeps the
// status and the body (bounded by the broker's answer limit, as an HTTP
// answer is).
type lineRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (l *lineRecorder) Header() http.Header { return l.header }

func (l *lineRecorder) WriteHeader(status int) {
	if l.status == 0 {
		l.status = status
	}
}

func (l *lineRecorder) Write(p []byte) (int, error) {
	if l.status == 0 {
		l.status = http.StatusOK
	}
	return l.body.Write(p)
}

// Flush is a no-op: a line's answer is kept whole.
func (l *lineRecorder) Flush() {}
