package simengine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config is the engine's cost model and identity.
type Config struct {
	// Model is the served model name; requests naming another get 404.
	Model string
	// TTFT is the base latency before the first token.
	TTFT time.Duration
	// PrefillPerToken is added to TTFT per prompt token.
	PrefillPerToken time.Duration
	// ITL is the delay between two tokens of a sequence.
	ITL time.Duration
	// Slots is how many sequences run at once; further requests wait in a
	// FIFO queue.
	Slots int
}

// DefaultConfig returns the defaults of cmd/sim-engine.
func DefaultConfig() Config {
	return Config{
		Model: "sim-model",
		TTFT:  20 * time.Millisecond,
		ITL:   10 * time.Millisecond,
		Slots: 8,
	}
}

// Validate reports what is missing or out of range.
func (c Config) Validate() error {
	var errs []error
	if c.Model == "" {
		errs = append(errs, fmt.Errorf("%w: model is required", ErrInvalidConfig))
	}
	if c.TTFT < 0 || c.PrefillPerToken < 0 || c.ITL < 0 {
		errs = append(errs, fmt.Errorf("%w: durations must not be negative", ErrInvalidConfig))
	}
	if c.Slots < 1 {
		errs = append(errs, fmt.Errorf("%w: slots must be at least 1, got %d", ErrInvalidConfig, c.Slots))
	}
	return errors.Join(errs...)
}

// Option sets a rare knob of New.
type Option func(*Engine)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(e *Engine) {
		if l != nil {
			e.log = l
		}
	}
}

// Load is a snapshot of the engine's occupancy.
type Load struct {
	Running, Waiting int
	// KVUsage is Running/Slots, in [0, 1].
	KVUsage float64
}

// Engine is one simulated model server. It is safe for concurrent use.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry
	idPrefix string
	ids      atomic.Uint64
	aborted  atomic.Int64

	// mu guards the slot accounting; it is never held while calling out.
	mu      sync.Mutex
	running int
	queue   []*waiter // FIFO
}

type waiter struct {
	ready   chan struct{}
	granted bool // under Engine.mu
}

// New returns an engine for cfg.
func New(cfg Config, opts ...Option) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var p [6]byte
	_, _ = rand.Read(p[:])
	e := &Engine{
		cfg:      cfg,
		log:      slog.New(slog.DiscardHandler),
		idPrefix: hex.EncodeToString(p[:]),
	}
	for _, o := range opts {
		o(e)
	}
	e.registry = newRegistry(e)
	return e, nil
}

// Model returns the served model name.
func (e *Engine) Model() string { return e.cfg.Model }

// Aborted returns how many requests ended early because their context was
// done or their emit failed.
func (e *Engine) Aborted() int64 { return e.aborted.Load() }

// Load returns the current occupancy.
func (e *Engine) Load() Load {
	e.mu.Lock()
	l := Load{Running: e.running, Waiting: len(e.queue)}
	e.mu.Unlock()
	l.KVUsage = float64(l.Running) / float64(e.cfg.Slots)
	return l
}

func (e *Engine) acquire(ctx context.Context) error {
	e.mu.Lock()
	if e.running < e.cfg.Slots && len(e.queue) == 0 {
		e.running++
		e.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan struct{})}
	e.queue = append(e.queue, w)
	e.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	e.mu.Lock()
	if w.granted {
		e.mu.Unlock()
		e.release()
		return ctx.Err()
	}
	for i, q := range e.queue {
		if q == w {
			e.queue = append(e.queue[:i], e.queue[i+1:]...)
			break
		}
	}
	e.mu.Unlock()
	return ctx.Err()
}

// release hands the slot to the oldest waiter, if any.
func (e *Engine) release() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue) == 0 {
		e.running--
		return
	}
	w := e.queue[0]
	e.queue[0] = nil
	e.queue = e.queue[1:]
	w.granted = true
	close(w.ready)
}

// check validates body for this engine.
func (e *Engine) check(api API, body []byte) (*request, *Error) {
	r, err := parseRequest(api, body)
	if err != nil {
		return nil, err
	}
	if r.model != "" && r.model != e.cfg.Model {
		return nil, modelNotFound(r.model)
	}
	return r, nil
}

// sink receives one generation. Its methods' errors abort the request.
type sink interface {
	// open is called once the request is accepted, before it waits for a
	// slot.
	open() error
	// first is called at the first token time, before any token.
	first() error
	token(text, json string) error
	finish(reason string, promptTokens, completionTokens int) error
}

// Stream runs one request and calls emit with each OpenAI streaming chunk:
// the JSON that follows "data: " in the SSE stream, without the [DONE]
// sentinel. It honours the timing model, the slots and queue, and ctx.
//
// The usage chunk (empty choices) is emitted when the body asks for
// stream_options.include_usage, or when it is not a streaming request, whose
// caller needs the usage to assemble a response. The chunk passed to emit is
// only valid until emit returns; its buffer is reused. An error from emit
// aborts the request and is returned. A request the engine refuses returns an
// *Error before any emit.
func (e *Engine) Stream(ctx context.Context, api API, body []byte, emit func(chunk []byte) error) error {
	r, err := e.check(api, body)
	if err != nil {
		return err
	}
	s := e.newChunkSink(r, emit)
	return e.run(ctx, r, s)
}

// run is the one implementation behind Stream and the HTTP handler.
func (e *Engine) run(ctx context.Context, r *request, s sink) error {
	o := r.outcome()
	if err := s.open(); err != nil {
		return e.abort(r, err)
	}
	if err := ctx.Err(); err != nil {
		return e.abort(r, err)
	}
	if err := e.acquire(ctx); err != nil {
		return e.abort(r, err)
	}
	defer e.release()

	var p pacer
	defer p.stop()
	start := time.Now()
	ttft := e.cfg.TTFT + time.Duration(o.promptTokens)*e.cfg.PrefillPerToken
	if err := p.wait(ctx, start, ttft); err != nil {
		return e.abort(r, err)
	}
	if err := s.first(); err != nil {
		return e.abort(r, err)
	}
	c := o.start
	for i := range o.tokens {
		if i > 0 {
			if err := p.wait(ctx, start, ttft+time.Duration(i)*e.cfg.ITL); err != nil {
				return e.abort(r, err)
			}
		}
		w, _ := c.next()
		if err := s.token(tokenText[w], tokenJSON[w]); err != nil {
			return e.abort(r, err)
		}
	}
	if o.tail != "" {
		if o.tokens > 0 {
			if err := p.wait(ctx, start, ttft+time.Duration(o.tokens)*e.cfg.ITL); err != nil {
				return e.abort(r, err)
			}
		}
		if err := s.token(o.tail, string(appendJSONString(nil, o.tail))); err != nil {
			return e.abort(r, err)
		}
	}
	if err := s.finish(o.finish, o.promptTokens, o.tokens); err != nil {
		return e.abort(r, err)
	}
	return nil
}

func (e *Engine) abort(r *request, err error) error {
	e.aborted.Add(1)
	if e.log.Enabled(context.Background(), slog.LevelDebug) {
		e.log.LogAttrs(context.Background(), slog.LevelDebug, "request aborted",
			slog.String("api", r.api.String()), slog.String("error", err.Error()))
	}
	return err
}

// pacer waits until deadlines measured from a start time, with one timer
// reset per token. Deadlines rather than delays keep the pace when emitting
// is slow, as an engine keeps decoding while a client lags.
type pacer struct {
	t *time.Timer
}

func (p *pacer) wait(ctx context.Context, start time.Time, at time.Duration) error {
	var d time.Duration
	if at > 0 {
		d = time.Until(start.Add(at))
	}
	if d <= 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		default:
			return nil
		}
	}
	if p.t == nil {
		p.t = time.NewTimer(d)
	} else {
		p.t.Reset(d)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-p.t.C:
		return nil
	}
}

func (p *pacer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}
