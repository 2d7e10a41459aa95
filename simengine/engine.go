package simengine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/oaiformat"
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
	// Batch, when enabled, times tokens by continuous-batching engine
	// steps instead of TTFT, PrefillPerToken and ITL; see the package
	// comment, "Batch model".
	Batch BatchModel

	// Role is RoleRegular (also the zero value), RolePrefill or RoleDecode;
	// see the package comment, "Prefill/decode disaggregation".
	Role Role
	// PDProtocol is the hand-off protocol of a prefill or decode engine.
	PDProtocol PDProtocol
	// BootstrapHost is the host a prefill engine's side channel listens on
	// and advertises (default 127.0.0.1).
	BootstrapHost string
	// BootstrapPort is the side channel's port; 0 picks a free one, which
	// [Engine.BootstrapPort] then reports.
	BootstrapPort int
	// BootstrapTimeout bounds how long a decode engine waits to reach its
	// prefill engine, or, with SGLang, for the bootstrap room to appear
	// (default 5s).
	BootstrapTimeout time.Duration
	// KVHoldTimeout is how long a prefill engine holds the KV of a
	// hand-off that no decode reads before freeing it (default 30s, vLLM
	// NixlConnector's kv_lease_duration); see [Engine.HeldKV].
	KVHoldTimeout time.Duration

	// LoadTime is how long the engine takes to "load its weights" after
	// New: until then it serves HTTP and gRPC but its health checks and
	// model endpoints answer 503 (gRPC: Unavailable), as vLLM and SGLang
	// do while loading. [LoadNever] never loads; 0 is loaded at once.
	LoadTime time.Duration

	// NoEmbeddings makes the engine answer /v1/embeddings with 404, as a
	// generation-only vLLM does.
	NoEmbeddings bool

	// PrefixCacheBlocks turns on the prefix cache with that many blocks
	// (vLLM's --enable-prefix-caching): a request's first token then costs
	// TTFT + PrefillPerToken x its uncached prompt tokens only. 0 is off.
	// See the package comment, "Prefix cache".
	PrefixCacheBlocks int
	// PrefixBlockSize is the prompt tokens per cache block (default 16,
	// vLLM's --block-size).
	PrefixBlockSize int
	// KVEvents publishes the prefix cache's stores and evictions as vLLM's
	// --kv-events-config does; it needs the prefix cache.
	KVEvents kvevents.Config
	// KVHash is how the prefix cache names its blocks: [KVHashBroker] (the
	// default) or [KVHashTokens]. See the package comment, "Prefix cache".
	KVHash string
	// KVHashSeed seeds KVHashTokens' chain, vLLM's NONE_HASH; 0 draws a
	// random one per process, as vLLM does unless PYTHONHASHSEED is set.
	KVHashSeed uint64
}

// Prefix cache block naming, Config.KVHash.
const (
	// KVHashBroker: blocks are prompt words, named by the broker's block
	// keys (affinity.AppendKeys over the sim template's rendering), so
	// KV events name what the broker looks up.
	KVHashBroker = "broker"
	// KVHashTokens: as real vLLM, blocks are token ids of the simulator's
	// tokenizer over a ChatML rendering (<|im_start|>role\n...<|im_end|>),
	// named by a seeded chain of hashes of token ids, which only an
	// agent that tokenizes the prompt with the engine (/tokenize) can
	// translate to broker keys.
	KVHashTokens = "tokens"
)

// LoadNever as [Config.LoadTime] makes an engine that never becomes
// healthy, like one whose weights fail to load.
const LoadNever time.Duration = math.MaxInt64

// Defaults of the PD settings.
const (
	DefaultBootstrapHost    = "127.0.0.1"
	DefaultBootstrapPort    = 8998 // SGLang's --disaggregation-bootstrap-port
	DefaultBootstrapTimeout = 5 * time.Second
	// DefaultKVHoldTimeout is vLLM NixlConnector's default lease on a
	// prefill's KV blocks (kv_lease_duration; VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
	// 480s, before the lease existed).
	DefaultKVHoldTimeout = 30 * time.Second
)

// DefaultConfig returns the defaults of cmd/sim-engine.
func DefaultConfig() Config {
	return Config{
		Model: "sim-model",
		TTFT:  20 * time.Millisecond,
		ITL:   10 * time.Millisecond,
		Slots: 8,

		Role:             RoleRegular,
		PDProtocol:       PDVLLM,
		BootstrapHost:    DefaultBootstrapHost,
		BootstrapPort:    DefaultBootstrapPort,
		BootstrapTimeout: DefaultBootstrapTimeout,
		KVHoldTimeout:    DefaultKVHoldTimeout,
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
	switch c.Role {
	case "", RoleRegular:
	case RolePrefill, RoleDecode:
		if c.PDProtocol != PDVLLM && c.PDProtocol != PDSGLang {
			errs = append(errs, fmt.Errorf("%w: role %s needs pd protocol %q or %q, got %q",
				ErrInvalidConfig, c.Role, PDVLLM, PDSGLang, c.PDProtocol))
		}
	default:
		errs = append(errs, fmt.Errorf("%w: role must be %q, %q or %q, got %q",
			ErrInvalidConfig, RoleRegular, RolePrefill, RoleDecode, c.Role))
	}
	if c.BootstrapPort < 0 || c.BootstrapPort > 65535 {
		errs = append(errs, fmt.Errorf("%w: bootstrap port must be in [0, 65535], got %d", ErrInvalidConfig, c.BootstrapPort))
	}
	if c.PrefixCacheBlocks < 0 || c.PrefixBlockSize < 0 {
		errs = append(errs, fmt.Errorf("%w: prefix cache blocks and block size must not be negative", ErrInvalidConfig))
	}
	switch c.KVHash {
	case "", KVHashBroker, KVHashTokens:
	default:
		errs = append(errs, fmt.Errorf("%w: kv hash %q: want %s or %s", ErrInvalidConfig, c.KVHash, KVHashBroker, KVHashTokens))
	}
	if c.KVEvents.Enabled && c.PrefixCacheBlocks == 0 {
		errs = append(errs, fmt.Errorf("%w: kv events need the prefix cache", ErrInvalidConfig))
	}
	if err := c.KVEvents.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, err))
	}
	if err := c.Batch.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.BootstrapTimeout < 0 || c.KVHoldTimeout < 0 || c.LoadTime < 0 {
		errs = append(errs, fmt.Errorf("%w: bootstrap timeout, KV hold timeout and load time must not be negative", ErrInvalidConfig))
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
//
// Lock order: Engine.mu, bootstrap.mu and batcher.mu are never held
// together.
type Engine struct {
	cfg        Config
	log        *slog.Logger
	registry   *prometheus.Registry
	idPrefix   string
	ids        atomic.Uint64
	aborted    atomic.Int64
	kvFailures atomic.Int64

	started   time.Time // New's time; LoadTime counts from it
	loaded    atomic.Bool
	engineID  string
	bootstrap *bootstrap   // prefill role only
	client    *http.Client // decode role only
	cache     *prefixCache // nil: no prefix caching
	batch     *batcher     // nil: the constant timing model
	kvpub     *kvevents.Publisher
	closeOnce sync.Once
	closeErr  error

	// mu guards the slot accounting; it is never held while calling out.
	mu      sync.Mutex
	running int
	queue   []*waiter // FIFO
}

type waiter struct {
	ready   chan struct{}
	granted bool // under Engine.mu
}

// New returns an engine for cfg. A prefill engine's side channel is
// listening when New returns; [Engine.Close] stops it.
func New(cfg Config, opts ...Option) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Role == "" {
		cfg.Role = RoleRegular
	}
	if cfg.Role == RoleRegular {
		cfg.PDProtocol = ""
	}
	if cfg.BootstrapHost == "" {
		cfg.BootstrapHost = DefaultBootstrapHost
	}
	if cfg.BootstrapTimeout == 0 {
		cfg.BootstrapTimeout = DefaultBootstrapTimeout
	}
	if cfg.KVHoldTimeout == 0 {
		cfg.KVHoldTimeout = DefaultKVHoldTimeout
	}
	var p [6]byte
	_, _ = rand.Read(p[:])
	var id [16]byte
	_, _ = rand.Read(id[:])
	e := &Engine{
		cfg:      cfg,
		log:      slog.New(slog.DiscardHandler),
		idPrefix: hex.EncodeToString(p[:]),
		started:  time.Now(),
		engineID: "sim-" + hex.EncodeToString(id[:]),
	}
	for _, o := range opts {
		o(e)
	}
	if cfg.Batch.Enabled {
		e.batch = newBatcher(cfg.Batch)
		e.cfg.Batch = e.batch.m
	}
	if cfg.PrefixCacheBlocks > 0 {
		if cfg.PrefixBlockSize == 0 {
			cfg.PrefixBlockSize = affinity.DefaultBlockSize
			e.cfg.PrefixBlockSize = cfg.PrefixBlockSize
		}
		if cfg.KVEvents.Publishes() {
			p, err := kvevents.Listen(cfg.KVEvents.Endpoint, cfg.KVEvents.Topic)
			if err != nil {
				return nil, err
			}
			e.kvpub = p
		}
		e.cache = newPrefixCache(cfg.PrefixCacheBlocks, cfg.PrefixBlockSize, e.kvpub)
		if cfg.KVHash == KVHashTokens {
			seed := cfg.KVHashSeed
			for seed == 0 {
				var b [8]byte
				_, _ = rand.Read(b[:])
				seed = binary.LittleEndian.Uint64(b[:])
			}
			e.cache.tokens, e.cache.seed = simTokenizer(), seed
		}
	}
	switch cfg.Role {
	case RolePrefill:
		b, err := startBootstrap(e)
		if err != nil {
			if e.kvpub != nil {
				_ = e.kvpub.Close()
			}
			return nil, err
		}
		e.bootstrap = b
	case RoleDecode:
		e.client = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // the side channel is never proxied
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	e.registry = newRegistry(e)
	return e, nil
}

// Close stops a prefill engine's side channel, failing the hand-offs that
// decode engines are waiting on, releases a decode engine's connections,
// and closes the KV events socket. Requests in flight are not interrupted. Close is idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		if e.bootstrap != nil {
			e.closeErr = e.bootstrap.close()
		}
		if e.client != nil {
			e.client.CloseIdleConnections()
		}
		if e.kvpub != nil {
			e.closeErr = errors.Join(e.closeErr, e.kvpub.Close())
		}
	})
	return e.closeErr
}

// Loaded reports whether [Config.LoadTime] has passed since New: before,
// the engine refuses requests and fails its health checks.
func (e *Engine) Loaded() bool {
	if e.loaded.Load() {
		return true
	}
	if e.cfg.LoadTime == LoadNever || time.Since(e.started) < e.cfg.LoadTime {
		return false
	}
	e.loaded.Store(true)
	return true
}

// Health returns nil once the engine is loaded, and before that the
// *[Error] (503, matching [ErrLoading]) that its health endpoints and its
// requests answer.
func (e *Engine) Health() error {
	if e.Loaded() {
		return nil
	}
	return e.loadingError()
}

func (e *Engine) loadingError() *Error {
	msg := fmt.Sprintf("model %s is loading (%v of %v)", e.cfg.Model,
		time.Since(e.started).Truncate(time.Millisecond), e.cfg.LoadTime)
	if e.cfg.LoadTime == LoadNever {
		msg = "model " + e.cfg.Model + " never finishes loading (load time never)"
	}
	return &Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable_error",
		Code: CodeModelLoading, Message: msg, err: ErrLoading}
}

// Role returns the engine's role (RoleRegular when unset).
func (e *Engine) Role() Role { return e.cfg.Role }

// PDProtocol returns the hand-off protocol, or "" for a regular engine.
func (e *Engine) PDProtocol() PDProtocol { return e.cfg.PDProtocol }

// EngineID is the vLLM remote_engine_id a prefill engine advertises.
func (e *Engine) EngineID() string { return e.engineID }

// BootstrapAddr returns host:port of a prefill engine's side channel, with
// the port actually bound, or "" for other roles.
func (e *Engine) BootstrapAddr() string {
	if e.bootstrap == nil {
		return ""
	}
	return net.JoinHostPort(e.cfg.BootstrapHost, strconv.Itoa(e.bootstrap.port))
}

// BootstrapHost returns the advertised side-channel host.
func (e *Engine) BootstrapHost() string { return e.cfg.BootstrapHost }

// BootstrapPort returns the side channel's bound port, or 0 for engines
// other than prefill.
func (e *Engine) BootstrapPort() int {
	if e.bootstrap == nil {
		return 0
	}
	return e.bootstrap.port
}

// HeldKV returns what a prefill engine holds for decodes now: hand-offs
// whose KV no decode has read yet, and their KV blocks (ceil(prompt tokens
// / [KVBlockSize]) each). It is 0, 0 for other roles.
func (e *Engine) HeldKV() (handoffs, blocks int) {
	if e.bootstrap == nil {
		return 0, 0
	}
	s := e.bootstrap.holdStats()
	return s.handoffs, s.blocks
}

// HandoffsExpired returns how many hand-offs a prefill engine freed unread
// at [Config.KVHoldTimeout].
func (e *Engine) HandoffsExpired() int64 {
	if e.bootstrap == nil {
		return 0
	}
	return e.bootstrap.holdStats().expired
}

// HandoffsAbandoned returns how many hand-offs a prefill engine freed
// unread before the timeout because a leg was aborted: the decode engine
// said its request was aborted, or a vLLM prefill was aborted before its
// last token.
func (e *Engine) HandoffsAbandoned() int64 {
	if e.bootstrap == nil {
		return 0
	}
	return e.bootstrap.holdStats().abandoned
}

// KVTransferFailures returns how many decode requests failed because their
// prefill hand-off could not be completed.
func (e *Engine) KVTransferFailures() int64 { return e.kvFailures.Load() }

// KVEventsEndpoint returns the bound endpoint of the KV events publisher
// ("tcp://host:port"), or "" when the engine publishes none.
func (e *Engine) KVEventsEndpoint() string {
	if e.kvpub == nil {
		return ""
	}
	return e.kvpub.Endpoint()
}

// PrefixCache returns the prefix cache's counters in tokens, as vLLM's
// prefix_cache_queries and prefix_cache_hits count them, and the blocks
// it holds now; all 0 when the cache is off.
func (e *Engine) PrefixCache() (queries, hits int64, blocks int) {
	if e.cache == nil {
		return 0, 0, 0
	}
	return e.cache.queries.Load(), e.cache.hits.Load(), e.cache.len()
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
	if !e.Loaded() {
		return nil, e.loadingError()
	}
	r, err := parseRequest(api, body)
	if err != nil {
		return nil, err
	}
	if r.model != "" && r.model != e.cfg.Model {
		return nil, modelNotFound(r.model)
	}
	if e.cfg.Role != RoleRegular {
		if err := e.checkPD(r); err != nil {
			return nil, err
		}
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
	// token is choice's next token.
	token(choice int, text, json string) error
	// stop ends choice's generation with reason.
	stop(choice int, reason string, extra []byte) error
	// finish ends the request once every choice has stopped, with its
	// usage.
	//
	// extra, when not empty, is top-level fields (",\"name\":value...")
	// for the last chunk or the response; it is passed to the last stop
	// and to finish, and a sink puts it in one of them.
	finish(u usageCounts, extra []byte) error
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
// *Error before any emit, and so does a decode whose hand-off fails (that
// one matches [ErrKVTransfer]). A vLLM prefill's kv_transfer_params come as
// a top-level field of the usage chunk.
func (e *Engine) Stream(ctx context.Context, api API, body []byte, emit func(chunk []byte) error) error {
	r, err := e.check(api, body)
	if err != nil {
		return err
	}
	s := e.newChunkSink(r, emit)
	return e.run(ctx, r, s)
}

// run is the one implementation behind Stream and the HTTP handler.
func (e *Engine) run(ctx context.Context, r *request, s sink) (err error) {
	o := r.outcome()
	if r.pd != nil && r.pd.role == RoleDecode {
		// Runs last, once the slot is free: an aborted decode that has not
		// read its KV tells the prefill to free it.
		defer func() {
			if err != nil && !r.pd.received && !errors.Is(err, ErrKVTransfer) {
				e.abandonKV(ctx, r)
			}
		}()
	}
	if r.pd != nil && r.pd.role == RolePrefill {
		if err := e.beginPrefill(r); err != nil {
			return err
		}
		// A prefill that ends before its KV is ready fails its hand-off, so
		// that a waiting decode fails at once rather than at its timeout.
		defer func() { e.endPrefill(r, err) }()
	}
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

	decode := r.pd != nil && r.pd.role == RoleDecode
	cached := 0 // prompt tokens found in the prefix cache
	var pc *prefixRun
	if e.cache != nil && !decode {
		// Looked up when scheduled, as vLLM does; only the uncached
		// tokens are prefilled.
		pc = e.cache.begin(r, o.promptTokens)
		cached = pc.cached
	}
	if decode {
		// The KV arrives from the prefill engine: nothing to prefill.
		if err := e.receiveKV(ctx, r); err != nil {
			if ctx.Err() != nil {
				return e.abort(r, ctx.Err())
			}
			e.kvFailures.Add(1)
			return err
		}
		r.pd.received = true
		if e.batch != nil {
			if err := e.batch.transfer(ctx, o.promptTokens); err != nil {
				return e.abort(r, err)
			}
		}
	}
	// The generation ends at its last output: 0 is the first token, i the
	// i-th next token, o.tokens the stop-string tail. Choices (n > 1)
	// generate side by side, each ending at its own last output.
	last := lastOutput(o)
	outs := make([]outcome, max(1, r.n))
	outs[0] = o
	for i := 1; i < r.n; i++ {
		outs[i] = r.choiceOutcome(i)
		last = max(last, lastOutput(outs[i]))
	}
	generated := func(i int) {
		if i >= last && r.pd != nil {
			r.pd.finished = true
		}
	}
	var wait func(i int) error // waits for output i
	if e.batch != nil {
		prefill := o.promptTokens - cached
		if decode {
			prefill = 0
		}
		ends := make([]int, len(outs))
		for i, x := range outs {
			ends[i] = lastOutput(x) + 1
		}
		seq := e.batch.join(prefill, ends)
		defer e.batch.leave(seq)
		wait = func(int) error { return e.batch.next(ctx, seq) }
	} else {
		var p pacer
		defer p.stop()
		// A decode's first token comes one ITL after its KV.
		start, ttft := time.Now(), e.cfg.ITL
		if !decode {
			ttft = e.prefillTime(o.promptTokens, cached)
		}
		wait = func(i int) error { return p.wait(ctx, start, ttft+time.Duration(i)*e.cfg.ITL) }
	}
	if err := wait(0); err != nil {
		return e.abort(r, err)
	}
	if r.pd != nil && r.pd.role == RolePrefill {
		e.prefilled(r, o.promptTokens)
	}
	if pc != nil {
		e.cache.store(pc) // the prompt's blocks, once prefilled
	}
	generated(0)
	if err := s.first(); err != nil {
		return e.abort(r, err)
	}
	chains := make([]chain, len(outs))
	completion := 0
	for i, x := range outs {
		chains[i] = x.start
		completion += x.tokens
	}
	var extra []byte
	if r.pd != nil {
		extra = r.pd.extra
	}
	choices := len(outs) // not stopped yet
	for k := 0; k <= last; k++ {
		if k > 0 {
			if err := wait(k); err != nil {
				return e.abort(r, err)
			}
			generated(k)
		}
		for i := range outs {
			x := &outs[i]
			var err error
			switch {
			case k < x.tokens:
				w, _ := chains[i].next()
				err = s.token(i, tokenText[w], tokenJSON[w])
				if i == 0 && pc != nil {
					_, _ = pc.h.WriteString(tokenText[w])
				}
			case k == x.tokens && x.tail != "":
				err = s.token(i, x.tail, string(oaiformat.AppendString(nil, x.tail)))
			}
			if err == nil && k == lastOutput(*x) {
				choices--
				var ex []byte
				if choices == 0 {
					ex = extra
				}
				err = s.stop(i, x.finish, ex)
			}
			if err != nil {
				return e.abort(r, err)
			}
		}
	}
	u := usageCounts{prompt: o.promptTokens, completion: completion, cached: -1}
	if pc != nil {
		u.cached = cached
	}
	if err := s.finish(u, extra); err != nil {
		return e.abort(r, err)
	}
	if pc != nil {
		// Generated tokens fill blocks too, which is what makes the next
		// turn of a conversation hit.
		e.cache.store(pc)
	}
	return nil
}

// prefillTime is the constant model's time to first token of a prompt of
// promptTokens tokens, cached of which are in the prefix cache.
func (e *Engine) prefillTime(promptTokens, cached int) time.Duration {
	return e.cfg.TTFT + time.Duration(max(0, promptTokens-cached))*e.cfg.PrefillPerToken
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
