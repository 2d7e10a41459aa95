package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// Request is one client request as the ingress hands it to the broker.
type Request struct {
	Model           string // empty: the only served model
	API             wire.API
	Stream          bool
	Body            []byte // validated OpenAI request JSON
	ClientRequestID string
	Need            dispatch.Need
	Deadline        time.Time // zero: now + RequestTimeout
	Trace           map[string]string
}

// Call is one request in flight. The ingress reads its chunks with Next and
// must Close it when done, which cancels the engine request if it has not
// finished.
type Call struct {
	ID       string
	Model    string
	Route    dispatch.Route
	Deadline time.Time
	Started  time.Time

	b       *Broker
	ch      chan *wire.Chunk
	attempt uint32
	nextSeq uint64 // touched only by the reply subscription's goroutine

	failOnce sync.Once
	failed   chan struct{}
	failErr  error

	ended  atomic.Bool // a final or error chunk was handed out
	closed atomic.Bool

	// Owned by the reading goroutine.
	deadline, stall *time.Timer
	firstToken      time.Time
	lastToken       time.Time
	tokens          int
	outcome         string
}

// Submit routes req, publishes its job and returns the Call that receives
// its chunks. Errors wrap the sentinels of errors.go.
func (b *Broker) Submit(ctx context.Context, req Request) (*Call, error) {
	if b.started.Load() == 0 {
		return nil, ErrClosed
	}
	if !b.nc.IsConnected() {
		return nil, ErrNotConnected
	}
	fleet := b.table.Load()
	model := req.Model
	if model == "" {
		models := fleet.Models()
		if len(models) != 1 {
			return nil, fmt.Errorf("%w: served models: %s", ErrNoModel, strings.Join(models, ", "))
		}
		model = models[0]
	}
	m, ok := fleet.Model(model)
	if !ok {
		if b.knownModel(model) {
			return nil, fmt.Errorf("%w %q", ErrNoCapacity, model)
		}
		return nil, fmt.Errorf("%w %q: served models: %s", ErrUnknownModel, model, strings.Join(fleet.Models(), ", "))
	}
	route, err := m.Decide(req.Need, b.rand())
	switch {
	case errors.Is(err, dispatch.ErrUnsupported):
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	case err != nil:
		return nil, fmt.Errorf("%w %q: %w", ErrNoCapacity, model, err)
	}
	pool := subjects.PoolRegular
	var pd *wire.PDHandoff
	if route == dispatch.RoutePD {
		pool = subjects.PoolPrefill
		pd = &wire.PDHandoff{}
	}
	subject, err := b.jobsSubject(model, pool)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnknownModel, err)
	}
	now := b.now()
	deadline := req.Deadline
	if deadline.IsZero() || deadline.Sub(now) > b.cfg.RequestTimeout {
		deadline = now.Add(b.cfg.RequestTimeout)
	}
	c := &Call{
		ID:       b.newRequestID(),
		Model:    model,
		Route:    route,
		Deadline: deadline,
		Started:  now,
		b:        b,
		ch:       make(chan *wire.Chunk, b.cfg.ChunkBuffer),
		failed:   make(chan struct{}),
	}
	reply, err := b.subj.Reply(b.cfg.ID, c.ID)
	if err != nil {
		return nil, err
	}
	job := &wire.Job{
		RequestId:       c.ID,
		Model:           model,
		Api:             req.API,
		Stream:          req.Stream,
		Body:            req.Body,
		ReplySubject:    reply,
		Deadline:        timestamppb.New(deadline),
		Trace:           req.Trace,
		ClientRequestId: req.ClientRequestID,
		BrokerId:        b.cfg.ID,
		Pd:              pd,
	}
	data, err := proto.Marshal(job)
	if err != nil {
		return nil, fmt.Errorf("broker: encode job: %w", err)
	}
	// Register before publishing: an agent may answer before Publish returns.
	b.calls.Store(c.ID, c)
	if _, err := b.js.Publish(ctx, subject, data); err != nil {
		b.calls.Delete(c.ID)
		return nil, publishError(subject, err)
	}
	b.metrics.inflight.Inc()
	b.countRoute(model, route)
	return c, nil
}

// JetStream's code for a store failure, which a per-subject bound with
// discard-new reports as "maximum messages per subject exceeded".
const jsStoreFailed = 10077

func publishError(subject string, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsStoreFailed {
		return fmt.Errorf("%w: %s: %w", ErrQueueFull, subject, err)
	}
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrConnectionReconnecting) {
		return fmt.Errorf("%w: publish %s: %w", ErrNotConnected, subject, err)
	}
	return fmt.Errorf("broker: publish %s: %w", subject, err)
}

// onReply demultiplexes one chunk to its Call. NATS calls it from the reply
// subscription's single goroutine, so per-call sequence state needs no lock.
func (b *Broker) onReply(m *nats.Msg) {
	i := strings.LastIndexByte(m.Subject, '.')
	if i < 0 {
		return
	}
	v, ok := b.calls.Load(m.Subject[i+1:])
	if !ok {
		return // finished or abandoned request: a late chunk
	}
	c := v.(*Call)
	chunk := new(wire.Chunk)
	if err := proto.Unmarshal(m.Data, chunk); err != nil {
		c.fail(fmt.Errorf("%w: request %s: undecodable chunk: %v", ErrStreamBroken, c.ID, err))
		return
	}
	if chunk.GetAttempt() != c.attempt {
		return // an abandoned attempt
	}
	if chunk.GetStage() == wire.Chunk_STAGE_PREFILL {
		// The prefill leg speaks only to say it started or failed; its
		// failure ends the request (Close then cancels the decode leg).
		if chunk.GetKind() == wire.Chunk_KIND_ERROR {
			c.fail(fmt.Errorf("request %s: prefill leg on %s: %w", c.ID, chunk.GetAgentId(), chunk.GetError()))
		}
		return
	}
	switch seq := chunk.GetSeq(); {
	case seq < c.nextSeq:
		return // duplicate
	case seq > c.nextSeq:
		c.fail(fmt.Errorf("%w: request %s: chunk %d missing (got %d)", ErrStreamBroken, c.ID, c.nextSeq, seq))
		return
	}
	c.nextSeq++
	select {
	case c.ch <- chunk:
	default:
		c.fail(fmt.Errorf("%w: request %s: client reads too slowly (%d chunks buffered)", ErrSlowReader, c.ID, cap(c.ch)))
	}
}

func (c *Call) fail(err error) {
	c.failOnce.Do(func() {
		c.failErr = err
		close(c.failed)
	})
}

// Next returns the next chunk in sequence order: accepted, tokens, then one
// final or error chunk. It returns an error when ctx ends, the deadline
// passes, the agent stalls or the stream breaks; after a final or error
// chunk it must not be called again.
func (c *Call) Next(ctx context.Context) (*wire.Chunk, error) {
	// Chunks already buffered win over a failure noticed later.
	select {
	case ch := <-c.ch:
		return c.deliver(ch), nil
	default:
	}
	// One goroutine reads a call, so its timers are reused across chunks.
	if c.deadline == nil {
		c.deadline = time.NewTimer(time.Until(c.Deadline))
		c.stall = time.NewTimer(c.b.cfg.StallTimeout)
	} else {
		c.stall.Reset(c.b.cfg.StallTimeout)
	}
	select {
	case ch := <-c.ch:
		return c.deliver(ch), nil
	case <-c.failed:
		return nil, c.failErr
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.deadline.C:
		return nil, fmt.Errorf("%w: request %s", ErrTimeout, c.ID)
	case <-c.stall.C:
		return nil, fmt.Errorf("%w: request %s: nothing for %s", ErrStalled, c.ID, c.b.cfg.StallTimeout)
	}
}

func (c *Call) deliver(ch *wire.Chunk) *wire.Chunk {
	switch ch.GetKind() {
	case wire.Chunk_KIND_TOKEN:
		now := time.Now()
		if c.firstToken.IsZero() {
			c.firstToken = now
			c.b.metrics.ttft.WithLabelValues(c.Model, c.Route.String()).Observe(now.Sub(c.Started).Seconds())
		} else {
			c.b.metrics.itl.WithLabelValues(c.Model, c.Route.String()).Observe(now.Sub(c.lastToken).Seconds())
		}
		c.lastToken = now
		if ch.GetDeltaText() != "" {
			c.tokens++
		}
	case wire.Chunk_KIND_FINAL:
		c.ended.Store(true)
		c.outcome = OutcomeOK
		if u := ch.GetUsage(); u != nil {
			c.tokens = int(u.GetCompletionTokens())
		}
	case wire.Chunk_KIND_ERROR:
		c.ended.Store(true)
		c.outcome = OutcomeError
	}
	return ch
}

// Outcomes of a request, as the requests metric counts them.
const (
	OutcomeOK        = "ok"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
)

// SetOutcome overrides the outcome recorded at Close, for ends the ingress
// sees first (the client went away, a broker-side error).
func (c *Call) SetOutcome(o string) { c.outcome = o }

// Close releases the call. If it has not ended it publishes a cancel so the
// agent aborts the engine request.
func (c *Call) Close() {
	if c.closed.Swap(true) {
		return
	}
	c.b.calls.Delete(c.ID)
	if c.deadline != nil {
		c.deadline.Stop()
		c.stall.Stop()
	}
	outcome := c.outcome
	if outcome == "" {
		outcome = OutcomeCancelled
	}
	m := c.b.metrics
	m.inflight.Dec()
	m.requests.WithLabelValues(c.Model, c.Route.String(), outcome).Inc()
	m.e2e.WithLabelValues(c.Model, c.Route.String()).Observe(time.Since(c.Started).Seconds())
	m.outputTokens.WithLabelValues(c.Model, c.Route.String()).Add(float64(c.tokens))
	// A request that ended well needs no cancel; any other end may leave a
	// leg running (the prefill of a PD request whose decode failed, or the
	// engine request of a client that went away).
	if c.ended.Load() && outcome == OutcomeOK {
		return
	}
	if subj, err := c.b.subj.Cancel(c.ID); err == nil {
		if err := c.b.nc.Publish(subj, nil); err != nil {
			c.b.log.Warn("cancel not published", "request", c.ID, "err", err)
		}
	}
}
