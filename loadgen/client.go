package loadgen

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/switchyard-ai/switchyard/oaiformat/sse"
)

// ErrorKind names why a request failed; the report counts each.
type ErrorKind string

// The error kinds. A 429 counts only as KindHTTP429, not as KindHTTP4xx.
const (
	KindHTTP4xx     ErrorKind = "http_4xx"
	KindHTTP429     ErrorKind = "http_429"
	KindHTTP5xx     ErrorKind = "http_5xx"
	KindHTTPOther   ErrorKind = "http_other" // a 1xx or 3xx final status
	KindTimeout     ErrorKind = "timeout"
	KindStreamError ErrorKind = "stream_error" // an error event, a broken body or no [DONE]
	KindConnect     ErrorKind = "connect"      // no response: dial, TLS, reset before headers

	kindCanceled ErrorKind = "canceled" // the run was cancelled; not reported
)

// Kinds lists every reported error kind, in report order.
var Kinds = []ErrorKind{KindHTTP4xx, KindHTTP429, KindHTTP5xx, KindHTTPOther, KindTimeout, KindStreamError, KindConnect}

// RouteHeader is the header a Switchyard broker names a request's route
// in; the raw output records it per request.
const RouteHeader = "X-Switchyard-Route"

// newTransport returns a Transport for many concurrent streams to one host:
// every connection kept for reuse, no proxy from the environment, and no
// gzip, which would buffer a stream and cost the client CPU.
func newTransport(conns int) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		DisableCompression:    true,
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 0,
		ReadBufferSize:        32 << 10,
		WriteBufferSize:       16 << 10,
		// One HTTP/1.1 connection per stream, as vLLM's aiohttp client
		// does: HTTP/2 would multiplex every stream over one connection
		// and its flow control would shape what is measured.
		ForceAttemptHTTP2: false,
	}
}

// record is one request's outcome.
type record struct {
	index        int
	warmup       bool
	start, end   time.Duration // offsets from the run's start
	ttft, e2e    time.Duration
	itl          []time.Duration
	outTokens    int
	promptTokens int
	kind         ErrorKind // "" on success
	err          error
	// route is the answer's x-switchyard-route header (regular or pd):
	// where a Switchyard broker sent the request; "" from other servers.
	route string
}

func (r *record) tpot() time.Duration {
	if r.outTokens < 2 {
		return 0
	}
	return (r.e2e - r.ttft) / time.Duration(r.outTokens-1)
}

// maxEvent bounds an SSE line and event of an answer: a server that
// sends a longer one fails its request (a stream error) instead of
// growing the client without bound.
const maxEvent = 4 << 20

var readers = sync.Pool{New: func() any { return sse.NewReader(nil, 0) }}

// client sends one request and times its stream.
type client struct {
	http    *http.Client
	url     string
	apiKey  string
	timeout time.Duration
}

func (c *client) do(run context.Context, body []byte, rec *record, epoch time.Time) {
	ctx := run
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		rec.kind, rec.err = KindConnect, err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	sent := time.Now()
	rec.start = sent.Sub(epoch)
	resp, err := c.http.Do(req)
	if err != nil {
		rec.kind, rec.err = classify(run, ctx, err, KindConnect), err
		return
	}
	defer resp.Body.Close()
	rec.route = resp.Header.Get(RouteHeader)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		rec.kind = statusKind(resp.StatusCode)
		rec.err = &StatusError{Code: resp.StatusCode, Body: string(bytes.TrimSpace(msg))}
		return
	}
	s := readers.Get().(*sse.Reader)
	s.Reset(resp.Body, maxEvent)
	defer func() { s.Reset(nil, 0); readers.Put(s) }()
	var last time.Time
	counted := 0
	for {
		e, err := s.Next()
		now := time.Now()
		data, isError := e.Data, string(e.Type) == "error"
		if errors.Is(err, io.ErrUnexpectedEOF) && string(data) == "[DONE]" {
			err = nil // [DONE] without its empty line
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				err = errNoDone
			}
			if rec.kind == "" || classify(run, ctx, err, "") == kindCanceled {
				rec.kind, rec.err = classify(run, ctx, err, KindStreamError), err
			}
			return
		}
		if string(data) == "[DONE]" {
			rec.e2e = now.Sub(sent)
			break
		}
		ev := scanEvent(data)
		if isError || ev.err {
			if rec.kind == "" {
				rec.kind, rec.err = KindStreamError, &StreamError{Event: string(data)}
			}
			continue // read on to [DONE] so the connection can be reused
		}
		if ev.usage {
			rec.outTokens, rec.promptTokens = ev.outTokens, ev.promptTokens
		}
		if ev.content {
			if counted == 0 {
				rec.ttft = now.Sub(sent)
			} else {
				rec.itl = append(rec.itl, now.Sub(last))
			}
			last = now
			counted++
		}
	}
	if rec.kind != "" {
		return
	}
	if rec.outTokens == 0 {
		rec.outTokens = counted
	}
	if counted == 0 {
		rec.ttft = rec.e2e // nothing generated; vLLM also takes the end
	}
	// Drain the (normally empty) rest so the connection goes back to the pool.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
}

var errNoDone = errors.New("stream ended without data: [DONE]")

// StatusError is a non-200 answer.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string {
	return "HTTP " + http.StatusText(e.Code) + ": " + e.Body
}

// StreamError is an error event inside a stream.
type StreamError struct {
	Event string
}

func (e *StreamError) Error() string { return "error event: " + e.Event }

func statusKind(code int) ErrorKind {
	switch {
	case code == http.StatusTooManyRequests:
		return KindHTTP429
	case code >= 400 && code < 500:
		return KindHTTP4xx
	case code >= 500:
		return KindHTTP5xx
	default:
		return KindHTTPOther
	}
}

// classify maps a transport error: the run's end (run done), a timeout (the
// request's own, req, or the network's), else fallback.
func classify(run, req context.Context, err error, fallback ErrorKind) ErrorKind {
	if run.Err() != nil {
		return kindCanceled
	}
	if req.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return KindTimeout
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return KindTimeout
	}
	return fallback
}
