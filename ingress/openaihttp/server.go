package openaihttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/switchyard-ai/switchyard/batch"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// Backend is what the ingress needs from the broker.
type Backend interface {
	Submit(ctx context.Context, req broker.Request) (*broker.Call, error)
	Models() []string
	Ready() error
	Fleet() *broker.Fleet
	Heartbeats() []*wire.Heartbeat
	Pending() []broker.PendingAgent
	RecentRoutes(model string, window time.Duration) broker.Recent
	QueueDepth() map[string]map[string]int
	InFlight(model string) broker.InFlight
	Affinity(model, pool string) broker.AffinityStats
}

// DefaultMaxBody is the largest request body accepted. The broker's embedded
// NATS server allows 8 MiB messages, which leaves room for the job envelope
// and, on migration, the text already generated.
const DefaultMaxBody = 4 << 20

// Config configures the HTTP ingress.
type Config struct {
	MaxBody int64
	// Metrics serves /metrics when set.
	Metrics http.Handler
	// WriteTimeout bounds writing a response from when it starts (see
	// Edge); streams move it on with each write by StreamWriteTimeout.
	// 0: no bound.
	WriteTimeout time.Duration
	// StreamWriteTimeout bounds each SSE write: a client that stops
	// reading for this long is cut off (its request cancelled) instead of
	// holding a goroutine and a buffer (default 30s).
	StreamWriteTimeout time.Duration
	// Page serves the fleet page at / and its assets under /ui/ when set.
	Page http.Handler
	// Batch serves the Files and Batches APIs when set.
	Batch *batch.Store
	// BodyReadTimeout bounds reading a request body, so a client trickling
	// its body cannot hold a connection and a buffer forever (default
	// DefaultBodyReadTimeout).
	BodyReadTimeout time.Duration
}

// Server is the HTTP ingress. It is an http.Handler.
type Server struct {
	cfg     Config
	backend Backend
	log     *slog.Logger
	mux     *http.ServeMux
	reqSeq  func() string
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New returns the ingress for backend.
func New(backend Backend, cfg Config, opts ...Option) *Server {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if cfg.StreamWriteTimeout <= 0 {
		cfg.StreamWriteTimeout = 30 * time.Second
	}
	s := &Server{cfg: cfg, backend: backend, log: slog.Default(), mux: http.NewServeMux()}
	for _, o := range opts {
		o(s)
	}
	s.routes()
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type apiKind struct {
	api    wire.API
	object string // object of a non-streaming response
}

var (
	chatAPI       = apiKind{wire.API_API_CHAT, "chat.completion"}
	completionAPI = apiKind{wire.API_API_COMPLETION, "text_completion"}
)

// requestID returns the client's x-request-id when it is sane, else a new one.
func requestID(r *http.Request) string {
	id := r.Header.Get("X-Request-Id")
	if id == "" || len(id) > 128 {
		return newID()
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return newID()
		}
	}
	return id
}

func (s *Server) completions(kind apiKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rid := requestID(r)
		w.Header().Set("X-Request-Id", rid)
		body, berr := s.readBody(w, r)
		if berr != nil {
			writeError(w, berr)
			return
		}
		p, err := oaiformat.Read(kind.api, body)
		if err != nil {
			writeError(w, fromFormat(err))
			return
		}
		class, deadline := lineClass(r)
		if class == broker.ClassInteractive {
			class = broker.FormatClass(p) // service_tier flex
		}
		call, err := s.backend.Submit(r.Context(), broker.Request{
			Class:           class,
			Deadline:        deadline,
			Model:           p.Model,
			API:             kind.api,
			Stream:          p.Stream,
			Body:            body,
			ClientRequestID: rid,
			NoPD:            p.NoPD != "",
			NoPDReason:      p.NoPD,
			NoMigration:     p.NoMigration,
			Trace:           traceContext(r),
			Format:          p,
			Targets:         sloTargets(r),
		})
		if err != nil {
			writeError(w, fromBroker(err))
			return
		}
		defer call.Close()
		setRoute(w.Header(), call.Route)
		if p.Stream {
			s.stream(w, r, call, p)
			return
		}
		s.assemble(w, r, call, kind)
	}
}

func traceContext(r *http.Request) map[string]string {
	tp := r.Header.Get("Traceparent")
	if tp == "" {
		return nil
	}
	m := map[string]string{"traceparent": tp}
	if ts := r.Header.Get("Tracestate"); ts != "" {
		m["tracestate"] = ts
	}
	return m
}

func agentHeader(c *wire.Chunk) string {
	if p := c.GetPrefillAgent(); p != "" {
		return p + "," + c.GetAgentId()
	}
	return c.GetAgentId()
}

var sseDone = []byte("[DONE]")

// appendEvent appends one SSE event with data d. Data that spans lines
// (an engine's pretty-printed JSON, which the agent joined with \n as the
// SSE spec says) goes out as one "data:" line per line, so a client's SSE
// reader joins it back into the same data; a bare \r would end a line for
// the client too, so it is a line break here as well.
func appendEvent(buf, d []byte) []byte {
	for {
		buf = append(buf, "data: "...)
		i := lineBreak(d)
		if i < 0 {
			buf = append(buf, d...)
			return append(buf, "\n\n"...)
		}
		buf = append(buf, d[:i]...)
		buf = append(buf, '\n')
		if d[i] == '\r' && i+1 < len(d) && d[i+1] == '\n' {
			i++
		}
		d = d[i+1:]
	}
}

// lineBreak returns the index of the first \r or \n in d, or -1. An
// engine's chunk is one line: two IndexByte scans (vectorized) find that
// out in a few ns, where bytes.IndexAny goes byte by byte.
func lineBreak(d []byte) int {
	i := bytes.IndexByte(d, '\n')
	if i < 0 {
		return bytes.IndexByte(d, '\r')
	}
	if j := bytes.IndexByte(d[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

// stream relays chunks as SSE. Headers are held back until the first token
// so that a failure before any output is still a proper HTTP error.
//
// This goroutine alone writes the response: the broker's reply goroutine
// only queues chunks on the call (bounded by its chunk buffer) and wakes
// it. A client that stops reading blocks only this goroutine, until the
// stream write timeout cuts it off.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, call *broker.Call, p *oaiformat.Request) {
	rc := http.NewResponseController(w)
	ctx := r.Context()
	out := &sseHead{w: w}
	sb := sseBufs.Get().(*sseBuffers)
	buf, events := sb.buf[:0], sb.events[:0]
	defer func() {
		if cap(buf) <= keptSSEBuffer {
			clear(events[:cap(events)]) // the chunks' bytes are not the pool's to keep
			sb.buf, sb.events = buf[:0], events[:0]
			sseBufs.Put(sb)
		}
	}()
	// write sends the events as SSE in one write. Under load several
	// chunks wait at once: they are all written before one flush, one
	// write(2) per burst instead of per token.
	// The write deadline is moved on at most every 1/16 of the timeout, not
	// per write: a client is still cut off after 15/16 to 16/16 of it.
	var deadlineSet time.Time
	put := func(data ...[]byte) error {
		if now := time.Now(); now.Sub(deadlineSet) > s.cfg.StreamWriteTimeout/16 {
			_ = rc.SetWriteDeadline(now.Add(s.cfg.StreamWriteTimeout))
			deadlineSet = now
		}
		buf = buf[:0]
		for _, d := range data {
			buf = appendEvent(buf, d)
		}
		_, err := w.Write(buf)
		return err
	}
	write := func(data ...[]byte) error {
		if err := put(data...); err != nil {
			return err
		}
		if call.Buffered() > 0 {
			return nil
		}
		return rc.Flush()
	}
	// The stream's last events are not flushed: net/http sends them with
	// the body's terminating chunk when the handler returns, one write(2)
	// and one wake-up of the client instead of two.
	fail := func(e *apiError) {
		if !out.started {
			writeError(w, e)
			return
		}
		_ = put(errorEvent(e))
	}
	for {
		c, err := call.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				call.SetOutcome(broker.OutcomeCancelled)
				return
			}
			if errors.Is(err, broker.ErrShutdown) {
				// The stream ends for good here: say so, then end it
				// as a stream ends, so the client does not wait.
				call.SetOutcome(broker.OutcomeShutdown)
				fail(fromBroker(err))
				if out.started {
					_ = put(sseDone)
				}
				return
			}
			call.SetOutcome(broker.OutcomeError)
			fail(fromBroker(err))
			return
		}
		switch c.GetKind() {
		case wire.Chunk_KIND_ACCEPTED:
			acceptedHeaders(w.Header(), call, c)
		case wire.Chunk_KIND_TOKEN:
			out.start()
			events = events[:0]
			for _, ev := range c.GetEvents() {
				events = append(events, ev.GetRaw())
			}
			if err := write(events...); err != nil {
				call.SetOutcome(broker.OutcomeCancelled)
				return
			}
		case wire.Chunk_KIND_FINAL:
			out.start()
			events = events[:0]
			if p.IncludeUsage && len(c.GetRaw()) > 0 {
				events = append(events, c.GetRaw())
			}
			_ = put(append(events, sseDone)...)
			return
		case wire.Chunk_KIND_ERROR:
			fail(fromWire(c.GetError()))
			return
		}
	}
}

// sseBuffers are a stream's SSE encoding buffer and its list of events
// to write, kept between streams: a stream grew its own from nothing.
type sseBuffers struct {
	buf    []byte
	events [][]byte
}

var sseBufs = sync.Pool{New: func() any { return new(sseBuffers) }}

// keptSSEBuffer is the largest encoding buffer kept for the next stream.
const keptSSEBuffer = 64 << 10

// sseHead starts a stream's response: its head is held back until the
// first token (or the end), so that a failure before any output is still
// a proper HTTP error.
type sseHead struct {
	w       http.ResponseWriter
	started bool
}

// Values of the headers every stream sets, made once: http.Header.Set
// makes a slice per value. A header's value slice is replaced, never
// written into, by net/http. Keys are canonical.
var (
	sseContentType = []string{"text/event-stream"}
	noCache        = []string{"no-cache"}
	noBuffering    = []string{"no"}
	regularRoute   = []string{dispatch.RouteRegular.String()}
	pdRoute        = []string{dispatch.RoutePD.String()}
)

// setRoute sets the X-Switchyard-Route header to r.
func setRoute(h http.Header, r dispatch.Route) {
	switch r {
	case dispatch.RouteRegular:
		h["X-Switchyard-Route"] = regularRoute
	case dispatch.RoutePD:
		h["X-Switchyard-Route"] = pdRoute
	default:
		h.Set("X-Switchyard-Route", r.String())
	}
}

// start sets the stream's status and headers, once.
func (h *sseHead) start() {
	if h.started {
		return
	}
	hd := h.w.Header()
	hd["Content-Type"] = sseContentType
	hd["Cache-Control"] = noCache
	hd["X-Accel-Buffering"] = noBuffering
	h.w.WriteHeader(http.StatusOK)
	h.started = true
}

// acceptedHeaders sets the route and agent headers of an accepted chunk
// (a retry may have moved the request to another route).
func acceptedHeaders(h http.Header, call *broker.Call, c *wire.Chunk) {
	setRoute(h, call.Route)
	h.Set("X-Switchyard-Agent", agentHeader(c))
}

type usage struct {
	PromptTokens     uint32 `json:"prompt_tokens"`
	CompletionTokens uint32 `json:"completion_tokens"`
	TotalTokens      uint32 `json:"total_tokens"`
}

// assemble collects a whole stream into one OpenAI response (see
// assembler).
//
// Nothing is written while the engine works: the request's deadline
// bounds the wait, and the write timeout (set by Edge as the answer
// starts) the write, the 504 of a request that reached its deadline
// included.
func (s *Server) assemble(w http.ResponseWriter, r *http.Request, call *broker.Call, kind apiKind) {
	a := &assembler{chat: kind.api == wire.API_API_CHAT}
	finish := ""
	for {
		c, err := call.Next(r.Context())
		if err != nil {
			if r.Context().Err() != nil {
				call.SetOutcome(broker.OutcomeCancelled)
				return
			}
			call.SetOutcome(broker.OutcomeError)
			if errors.Is(err, broker.ErrShutdown) {
				call.SetOutcome(broker.OutcomeShutdown)
			}
			writeError(w, fromBroker(err))
			return
		}
		switch c.GetKind() {
		case wire.Chunk_KIND_ACCEPTED:
			acceptedHeaders(w.Header(), call, c)
		case wire.Chunk_KIND_TOKEN:
			for _, ev := range c.GetEvents() {
				if err := a.add(ev); err != nil {
					// Close cancels the engine request.
					call.SetOutcome(broker.OutcomeError)
					writeError(w, outputTooLarge(err.Error()))
					return
				}
			}
		case wire.Chunk_KIND_ERROR:
			writeError(w, fromWire(c.GetError()))
			return
		case wire.Chunk_KIND_FINAL:
			finish = c.GetFinishReason()
			if a.id == "" {
				a.id = newID()
				a.created = time.Now().Unix()
				a.model = call.Model
			}
			// Every member of the engine's usage (token details) is the
			// client's; the counts are the broker's, which add up a
			// migrated stream's attempts.
			u := oaiformat.Usage(c.GetRaw(), c.GetUsage())
			writeJSON(w, http.StatusOK, a.response(kind, finish, u))
			return
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // as OpenAI's API and the engines answer
	_ = enc.Encode(v)
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	data := []model{}
	for _, m := range s.backend.Models() {
		data = append(data, model{ID: m, Object: "model", OwnedBy: "switchyard"})
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", data})
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "ok\n")
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.backend.Ready(); err != nil {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "not ready: " + err.Error(), Type: "server_error", Code: strp("not_ready"), RetryAfter: 1})
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "ready\n")
}
