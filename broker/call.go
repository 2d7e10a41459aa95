package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/natsx"
	"github.com/switchyard-ai/switchyard/oaiformat"
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
	// NoPD, when set, keeps the request off the PD pipeline (an operation
	// or parameter PD does not serve); NoPDReason says why, for the error
	// when only PD could serve it.
	NoPD       bool
	NoPDReason string
	// NoMigration, when set, says why a stream of this request cannot be
	// continued on another agent from its text so far (n > 1 choices, or
	// tools whose calls may be half sent): after its first token, a broken
	// stream ends with an error instead of a migration.
	NoMigration string
	Deadline    time.Time // zero: now + RequestTimeout
	Trace       map[string]string
	// Format is Body as oaiformat.Read read it, or nil: what the broker
	// needs of the body (the prompt's block keys) is then decoded again.
	Format *oaiformat.Request
	// Targets are the request's latency targets (dispatch.ModeSLO and the
	// attainment metric); a zero field takes Config.Targets'.
	Targets Targets
	// Class is the request's work class (ClassInteractive when zero).
	Class Class
}

// Call is one request in flight. The ingress reads its chunks with Next and
// must Close it when done, which cancels the engine request if it has not
// finished.
//
// Until the first token reaches the client, the call retries on its own: an
// attempt that fails with a retryable error, whose agent dies, or that sits
// in a queue no live agent serves, is abandoned (cancelled by attempt
// number, so late chunks are dropped) and dispatched again.
//
// Two goroutines use a call: the broker's reply goroutine, which relays
// chunks into its inbox, and the reader (the ingress's handler, through
// Next and Close), which owns everything else. The embedded types group
// the state by concern and say which goroutine owns it and which lock
// guards it; broker/locksordering.txt gives the order of the locks. The
// groups with behaviour of their own keep it beside them: the inbox and
// its byte bounds (callbuffer.go), the attempt's identity
// (callidentity.go), the reader's clock (callclock.go) and what reached
// the client (calltally.go). The Call's own methods coordinate them: its
// lifecycle here, the reader's checks of an attempt in callwatch.go.
type Call struct {
	ID       string
	Model    string
	Route    dispatch.Route // written by the reader (each attempt's dispatch)
	Deadline time.Time
	Started  time.Time

	b       *Broker
	req     Request
	body    []byte             // the body of the current attempt (a continuation after a migration); the reader's
	cont    *wire.Continuation // set on migrated attempts; the reader's
	replyTo string
	// ready wakes a reader that found no chunk queued (see inbox).
	ready chan struct{}

	// mu guards inbox and attemptIdentity: the reply goroutine against
	// the reader.
	mu sync.Mutex
	inbox
	attemptIdentity

	ended    atomic.Bool  // a final or error chunk was handed out
	recancel atomic.Int64 // unix nanos of the last cancelAgain
	// arrived is when a chunk of the current attempt last arrived (unix
	// nanos; 0: none yet), which may be well before the reader takes it.
	arrived atomic.Int64
	closed  atomic.Bool

	readerClock
	attemptRun
	publishState
	clientTally
}

// attemptRun is what the reader knows of the current attempt and of the
// attempts before it: who took it, where it stands, what it counts in
// flight. The reader owns every field; no lock.
type attemptRun struct {
	attemptStart    time.Time
	agent           string // the agent that accepted the current attempt
	prefillAgent    string
	ranOn           []string    // the agents of earlier attempts, in order, for the log line
	pair            string      // the PD pairing of the current attempt
	heard           time.Time   // when the current attempt last spoke (any chunk)
	deliveryChecked time.Time   // when deliveredUnaccepted last asked
	handedOff       time.Time   // when the current attempt's prefill leg handed off
	load            attemptLoad // what the current attempt counts in flight
	aff             callAffinity
	retries         int
	tm              callTiming // what this call teaches the broker's timing (timing.go)
	migrations      int
	repairs         int // the migrations for chunks lost in transit (see transportRepairLimit)
	preemptions     int // the retries and migrations of a preempted batch job (see preempted)
}

// publishState is the current attempt's job and its publish, owned by the
// reader.
type publishState struct {
	jobSeq    uint64    // the stream sequence of the current attempt's job
	publishBy time.Time // the bound of the current attempt's publish; zero: PublishWait from when it starts
	// job and deadlineTS are the current attempt's job while dispatch
	// encodes it (see dispatch): no message of its own per attempt.
	job        wire.Job
	deadlineTS timestamppb.Timestamp
}

// Submit routes req, publishes its job and returns the Call that receives
// its chunks. Errors wrap the sentinels of errors.go.
func (b *Broker) Submit(ctx context.Context, req Request) (*Call, error) {
	c, err := b.submit(ctx, req)
	if err != nil {
		b.metrics.Reject(rejectReason(err))
	}
	return c, err
}

// rejectReason is the bounded label of a refused request.
func rejectReason(err error) string {
	for _, r := range []struct {
		err    error
		reason string
	}{
		{ErrQueueFull, "queue_full"}, {ErrQueueTimeout, "queue_timeout"}, {ErrNoCapacity, "no_capacity"}, {ErrUnsupported, "unsupported"},
		{ErrUnknownModel, "unknown_model"}, {ErrNoModel, "no_model"}, {ErrNotConnected, "not_connected"}, {ErrClosed, "closed"},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}

func (b *Broker) submit(ctx context.Context, req Request) (*Call, error) {
	if b.started.Load() == 0 || b.closing.Load() {
		return nil, ErrClosed
	}
	// Waits for NATS (a reconnect to another node, a leader election) and
	// the publish of the first job share one bound.
	publishBy := time.Now().Add(b.cfg.PublishWait)
	if !b.nc.IsConnected() && !b.awaitConnected(ctx, publishBy) {
		return nil, fmt.Errorf("%w (waited %s)", ErrNotConnected, b.cfg.PublishWait)
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
	if _, ok := fleet.Model(model); !ok && !b.knownModel(model) {
		return nil, fmt.Errorf("%w %q: served models: %s", ErrUnknownModel, model, strings.Join(fleet.Models(), ", "))
	}
	now := b.now()
	deadline := req.Deadline
	if deadline.IsZero() || deadline.Sub(now) > b.cfg.RequestTimeout {
		deadline = batchDeadline(req.Class, deadline, now.Add(b.cfg.RequestTimeout))
	}
	c := &Call{
		ID:       b.newRequestID(),
		Model:    model,
		Deadline: deadline,
		Started:  now,
		b:        b,
		req:      req,
		body:     req.Body,
		ready:    make(chan struct{}, 1),
	}
	c.publishBy = publishBy
	c.replyTo = b.replyChunks
	// Register before publishing: an agent may answer before Publish returns.
	b.calls.Store(c.ID, c)
	if err := c.startFirst(ctx); err != nil {
		b.calls.Delete(c.ID)
		return nil, err
	}
	b.metrics.inflight.Inc()
	return c, nil
}

// dispatch decides the route of the current attempt and publishes its job.
func (c *Call) dispatch(ctx context.Context) error {
	b := c.b
	began := time.Now()
	m, ok := b.table.Load().Model(c.Model)
	if !ok {
		return fmt.Errorf("%w %q", ErrNoCapacity, c.Model)
	}
	flight := b.flight.model(c.Model)
	d, err := m.Decide(c.need(m), flight, b.rand())
	c.decided(&d)
	switch {
	case errors.Is(err, dispatch.ErrUnsupported):
		return fmt.Errorf("%w: %v", ErrUnsupported, err)
	case err != nil:
		return fmt.Errorf("%w %q: %w", ErrNoCapacity, c.Model, err)
	}
	route := d.Route
	pool := subjects.PoolRegular
	var pd *wire.PDHandoff
	if route == dispatch.RoutePD {
		pool = subjects.PoolPrefill
		pd = &wire.PDHandoff{}
	}
	subject, err := b.classSubject(c.req.Class, c.Model, pool, d.Pair)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnknownModel, err)
	}
	if c.req.Class != ClassBatch {
		subject = c.prefer(m, pool, d.Pair, subject)
	}
	// Each attempt has its own secret: chunks must bring it back, as the
	// reply subject is shared by every request of the broker.
	secret := newSecret()
	c.mu.Lock()
	attempt := c.attempt
	c.secret = secret
	c.mu.Unlock()
	// The job and its deadline are the call's, overwritten per attempt:
	// the encoding below is all that outlives this.
	c.deadlineTS = timestamppb.Timestamp{Seconds: c.Deadline.Unix(), Nanos: int32(c.Deadline.Nanosecond())}
	job := &c.job
	*job = wire.Job{
		RequestId:       c.ID,
		Attempt:         attempt,
		Model:           c.Model,
		Api:             c.req.API,
		Stream:          c.req.Stream,
		Body:            c.body,
		ReplySubject:    c.replyTo,
		Continuation:    c.cont,
		Deadline:        &c.deadlineTS,
		Trace:           c.req.Trace,
		ClientRequestId: c.req.ClientRequestID,
		BrokerId:        b.cfg.ID,
		Pd:              pd,
		PdPair:          d.Pair,
		Secret:          secret,
		Batch:           c.req.Class == ClassBatch,
		Preemptible:     c.preemptible(),
	}
	data, err := proto.Marshal(job)
	if err != nil {
		return fmt.Errorf("broker: encode job: %w", err)
	}
	c.Route, c.pair = route, d.Pair
	c.ranOn = appendAgents(c.ranOn, c.prefillAgent, c.agent)
	c.agent, c.prefillAgent, c.jobSeq, c.handedOff, c.heard = "", "", 0, time.Time{}, time.Time{}
	c.arrived.Store(0)
	// A leader election or a reconnect is waited out, within the publish
	// wait; past it the request gets a 503, not a hang. An unconfirmed
	// publish may still land later, so the attempt is cancelled to keep it
	// from starting.
	seq, err := c.publishFirst(ctx, subject, data, attempt)
	if err != nil {
		c.cancelAttempt(attempt)
		return publishError(subject, err)
	}
	// The attempt's clock starts once its job is queued: a publish that
	// waited out an election must not count as time nobody took it.
	c.attemptStart = b.now()
	b.metrics.dispatchPublish.Observe(time.Since(began).Seconds())
	c.jobSeq = seq
	if c.req.Class != ClassBatch {
		// A batch job takes no capacity from interactive dispatch: agents
		// run it only on room interactive work leaves.
		c.load.dispatched(flight, route, c.pair)
	}
	c.offered(seq, data)
	b.countRoute(c.Model, route)
	return nil
}

// retry abandons the current attempt and dispatches the next one. It is
// called by the reader before any token reached the client.
func (c *Call) retry(ctx context.Context, why error) error {
	if preempted(why) {
		c.preemptions++ // the agent gave its slot to interactive work
	} else if c.retries-c.preemptions >= c.b.cfg.RetryLimit {
		return fmt.Errorf("request %s: %d retries: %w", c.ID, c.retries, why)
	}
	if err := c.startAttempt(ctx, retryAttempt, why); err != nil {
		return fmt.Errorf("request %s: retry after %v: %w", c.ID, why, err)
	}
	return nil
}

func retryReason(err error) string {
	switch {
	case errors.Is(err, errNotTaken):
		return "not_taken"
	case errors.Is(err, errAgentLost):
		return "agent_lost"
	case errors.Is(err, errHandoffExpired):
		return "handoff_expired"
	case errors.Is(err, ErrStalled):
		return "stalled"
	}
	return "attempt_failed"
}

var (
	errNotTaken       = errors.New("no live agent took the job")
	errAgentLost      = errors.New("agent lost")
	errHandoffExpired = errors.New("no decode agent took the hand-off while the prefill engine held its KV")
)

type brokenAttempt struct {
	attempt uint32
	err     error
	current bool // set by next: the attempt is still the call's current one
}

// cancelAttempt tells agents to drop attempts up to and including attempt.
func (c *Call) cancelAttempt(attempt uint32) {
	subj, err := c.b.subj.Cancel(c.ID)
	if err != nil {
		return
	}
	if err := c.b.nc.Publish(subj, wire.AppendCancel(nil, attempt, "")); err != nil {
		c.b.log.Warn("cancel not published", "request", c.ID, "err", err)
	}
}

// cancelAgain repeats the cancel of an abandoned attempt that still
// speaks, at most once a second: its cancel may have been lost while its
// agent reconnected to another NATS node, and its engine would run on for
// nobody.
func (c *Call) cancelAgain(attempt uint32) {
	now := time.Now().UnixNano()
	last := c.recancel.Load()
	if now-last < int64(time.Second) || !c.recancel.CompareAndSwap(last, now) {
		return
	}
	c.cancelAttempt(attempt)
}

// orphanCancels bounds the requests whose late chunks cancelOrphan
// remembers; past it the memory starts again.
const orphanCancels = 4096

// cancelOrphan cancels every attempt of a request that is no longer in
// flight but whose chunks still arrive, at most once a second per
// request.
//
// Only ids this broker issued: its reply subject is shared by all its
// requests and any agent can publish to it, so a chunk naming another
// broker's request must not make this one cancel it.
func (b *Broker) cancelOrphan(id string) {
	if !strings.HasPrefix(id, b.cfg.ID+"-") {
		return
	}
	now := time.Now()
	b.orphanMu.Lock()
	if last, ok := b.orphans[id]; ok && now.Sub(last) < time.Second {
		b.orphanMu.Unlock()
		return
	}
	if b.orphans == nil || len(b.orphans) >= orphanCancels {
		b.orphans = make(map[string]time.Time)
	}
	b.orphans[id] = now
	b.orphanMu.Unlock()
	subj, err := b.subj.Cancel(id)
	if err != nil {
		return
	}
	if err := b.nc.Publish(subj, nil); err != nil {
		b.log.Debug("cancel of a finished request not published", "request", id, "err", err)
	}
}

// publishError names a failed job publish: a full queue (429), NATS away
// for now (503), or anything else.
func publishError(subject string, err error) error {
	if natsx.QueueFull(err) {
		return fmt.Errorf("%w: %s: %w", ErrQueueFull, subject, err)
	}
	if natsx.NotNow(err) || errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("%w: publish %s: %w", ErrNotConnected, subject, err)
	}
	return fmt.Errorf("broker: publish %s: %w", subject, err)
}

// onReply demultiplexes one reply message, which carries one or more
// chunks (see wire.Frames), to their Calls. NATS calls it from the reply
// subscription's single goroutine, so per-call sequence state needs no lock.
func (b *Broker) onReply(m *nats.Msg) {
	// The chunks of a message arrived together: one clock read for all.
	now := b.now().UnixNano()
	if err := wire.Frames(m.Data, func(data []byte) error { return b.onChunk(data, now) }); err != nil {
		b.metrics.droppedChunks.WithLabelValues("undecodable").Inc()
		b.log.Debug("undecodable reply message", "subject", m.Subject, "err", err)
	}
}

// onChunk takes one chunk to its Call. A chunk that is not its attempt's
// (a late chunk of an abandoned attempt, or one without the attempt's
// secret: forged) is dropped.
//
// The chunk comes from the broker's pool and aliases the message's data
// (see wire.DecodeChunk), which nats.go allocates per message and nobody
// writes; the reader gives it back to the pool (see Next).
func (b *Broker) onChunk(data []byte, arrived int64) error {
	chunk := b.getChunk()
	if err := wire.DecodeChunk(data, chunk); err != nil {
		b.putChunk(chunk)
		// Without a request id it is no one's; a frame lost like this shows
		// as a gap in its attempt's sequence.
		b.metrics.droppedChunks.WithLabelValues("undecodable").Inc()
		return nil
	}
	v, ok := b.calls.Load(chunk.GetRequestId())
	if !ok {
		// A finished or abandoned request: a late chunk, a chunk sent
		// again after a reconnect, or an agent still running it for
		// nobody (its cancel lost in a failover, a job delivered twice).
		b.cancelOrphan(strings.Clone(chunk.GetRequestId()))
		b.putChunk(chunk)
		return nil
	}
	c := v.(*Call)
	if !b.relay(c, chunk, len(data), arrived) {
		b.putChunk(chunk)
	}
	return nil
}

// relay hands chunk, decoded from size bytes, which arrived at the given
// unix nanos, to c if it is the current attempt's next, and reports
// whether it did.
func (b *Broker) relay(c *Call, chunk *wire.Chunk, size int, arrived int64) bool {
	c.mu.Lock()
	if c.failErr != nil {
		// The call has ended: what comes after is nobody's (its cancel is
		// on the way, or it is already closed).
		c.mu.Unlock()
		return false
	}
	if chunk.GetSecret() != c.secret {
		a := chunk.GetAttempt()
		abandoned := a < c.attempt
		c.mu.Unlock()
		if abandoned {
			// Each attempt has its own secret: an abandoned attempt's
			// agent still speaks, its cancel lost in a failover.
			c.cancelAgain(a)
		} else {
			b.metrics.droppedChunks.WithLabelValues("bad_secret").Inc()
			b.log.Warn("chunk without its attempt's secret dropped", "request", c.ID, "attempt", a, "agent", chunk.GetAgentId())
		}
		return false
	}
	if a := chunk.GetAttempt(); a != c.attempt {
		abandoned := a < c.attempt
		c.mu.Unlock()
		if abandoned {
			c.cancelAgain(a)
		}
		return false
	}
	// Two agents may run one attempt: an affinity offer that moved to the
	// shared queue just as its agent took it (JetStream deletes a
	// delivered, unacked message and acks it afterwards without
	// complaint), or an ack lost in a failover (agents speak before their
	// ack is confirmed). The first agent to speak in a stage is the one
	// listened to; any other is told to stop as soon as it speaks, so it
	// does not hold an engine slot for nobody.
	//
	// The prefill leg speaks only to say it started, works, handed off or
	// failed, outside the decode leg's sequence; keep-alives are outside
	// every sequence.
	id := chunk.GetAgentId()
	prefill := chunk.GetStage() == wire.Chunk_STAGE_PREFILL
	speaker := &c.speaker
	if prefill {
		speaker = &c.prefillSpeaker
	}
	switch {
	case *speaker == "" && chunk.GetKind() != wire.Chunk_KIND_KEEPALIVE:
		*speaker = strings.Clone(id) // kept for the attempt: not the message's bytes
	case *speaker != "" && id != *speaker:
		attempt, stop := c.attempt, c.stopOtherLocked(id)
		c.mu.Unlock()
		if stop {
			c.stopOther(attempt, id, prefill)
		}
		return false
	}
	if chunk.GetKind() != wire.Chunk_KIND_KEEPALIVE && !prefill {
		switch seq := chunk.GetSeq(); c.sequence(seq) {
		case seqDuplicate:
			c.mu.Unlock()
			return false
		case seqGap:
			// A chunk was lost (a NATS node failed under the stream): the
			// reader repairs it with a retry or a migration.
			if c.broken == nil {
				c.broken = &brokenAttempt{attempt: c.attempt, err: fmt.Errorf("%w: request %s: chunk %d missing (got %d)", ErrStreamBroken, c.ID, c.gapAt, seq)}
			}
			c.mu.Unlock()
			c.wake()
			return false
		}
	}
	wake, err := c.add(chunk, size, c.req.Stream, c.b.cfg.MaxAnswerBytes, c.b.cfg.BufferBytes, c.ID)
	if err != nil {
		c.endAtBound()
		return false
	}
	c.mu.Unlock()
	c.arrived.Store(arrived)
	if wake {
		select {
		case c.ready <- struct{}{}:
		default:
		}
	}
	return true
}

// endAtBound ends a call that passed a bound on its bytes (failErr is
// set, c.mu held and released here): the engine request is cancelled at
// once, not when the reader gets to Close, which a client that stopped
// reading may delay until its write timeout, its engine slot held and its
// output dropped meanwhile.
func (c *Call) endAtBound() {
	attempt := c.attempt
	c.mu.Unlock()
	c.wake()
	c.cancelAttempt(attempt)
}

// next takes the first queued chunk, or else what ends or repairs the
// call (see inbox.take).
func (c *Call) next() (*wire.Chunk, *brokenAttempt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.take(c.attempt)
}

// stopOther cancels attempt at agent alone: the attempt's speaker goes on.
func (c *Call) stopOther(attempt uint32, agent string, prefill bool) {
	stage := "main"
	if prefill {
		stage = "prefill"
	}
	c.b.metrics.secondRuns.WithLabelValues(stage).Inc()
	c.b.log.Info("second agent running an attempt stopped", "request", c.ID, "attempt", attempt, "agent", agent, "stage", stage)
	subj, err := c.b.subj.Cancel(c.ID)
	if err != nil {
		return
	}
	if err := c.b.nc.Publish(subj, wire.AppendCancel(nil, attempt, agent)); err != nil {
		c.b.log.Warn("cancel not published", "request", c.ID, "agent", agent, "err", err)
	}
}

// getChunk returns a chunk to decode into: one a reader gave back, with
// the events of its last decode to reuse, or a new one.
func (b *Broker) getChunk() *wire.Chunk {
	if ch, ok := b.chunkPool.Get().(*wire.Chunk); ok {
		return ch
	}
	return new(wire.Chunk)
}

// putChunk gives a chunk nobody reads any more back to the pool.
func (b *Broker) putChunk(ch *wire.Chunk) { b.chunkPool.Put(ch) }

// fail ends the call with err (the first failure stays): the reader
// returns it once it has taken the chunks queued before.
func (c *Call) fail(err error) {
	c.mu.Lock()
	c.failed(err)
	c.mu.Unlock()
	c.wake()
}

// wake signals the reader, if it waits or is about to.
func (c *Call) wake() {
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// Next returns the next chunk in sequence order: accepted, tokens, then one
// final or error chunk. It returns an error when ctx ends, the deadline
// passes, the agent stalls or the stream breaks; after a final or error
// chunk it must not be called again. Before the first token it retries
// failed or stuck attempts itself.
//
// The chunk and its events are valid until the next call of Next or
// Close, which reuse them for later chunks: a reader must not keep them.
// The strings and byte slices in them stay valid and unchanged (they are
// the reply message's, see wire.DecodeChunk), as does the chunk's Error or
// Usage.
func (c *Call) Next(ctx context.Context) (*wire.Chunk, error) {
	// One goroutine reads a call, so its timer is reused across chunks. It
	// stands for the deadline, the stall check and the watch: one timer in
	// the select instead of three, as each blocking select arms every
	// timer it waits on and disarms it when woken, once per token (see
	// readerClock). The watch looks for dead agents and, before the first
	// token, for jobs no one can take.
	c.ask(c.Deadline, c.b.cfg.StallTimeout, c.b.cfg.WatchInterval)
	for {
		c.release()
		// Chunks already queued win over a failure noticed later.
		ch, br, failErr := c.next()
		if ch == nil {
			if failErr != nil {
				return nil, failErr
			}
			if br != nil {
				if br.current {
					if err := c.recover(ctx, br.err); err != nil {
						return nil, err
					}
					c.restartStall()
				}
				continue
			}
			select {
			case <-c.ready:
				continue // (or a wake-up left from an earlier wait)
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-c.aff.move:
				if err := c.moveOffer(ctx); err != nil {
					if err := c.recover(ctx, err); err != nil {
						return nil, err
					}
					c.restartStall()
				}
				continue
			case <-c.timer.C:
				now := c.fired()
				if c.expired(now) {
					return nil, fmt.Errorf("%w: request %s", ErrTimeout, c.ID)
				}
				if c.stallDue(now) {
					if err := c.checkStall(ctx); err != nil {
						return nil, err
					}
				}
				if c.watchDue(now) {
					if err := c.checkWatch(ctx); err != nil {
						return nil, err
					}
				}
				c.rearm()
				continue
			}
		}
		c.held = ch // from here every continue gives it back at the top of the loop
		c.mu.Lock()
		current := ch.GetAttempt() == c.attempt
		c.mu.Unlock()
		if !current {
			continue // queued before the attempt was abandoned
		}
		c.heard = c.b.now()
		switch ch.GetKind() {
		case wire.Chunk_KIND_KEEPALIVE:
			// The agent holding the attempt is alive and its engine works
			// on it: before the first token that is all the stall timer
			// asks, so a long prefill is never taken for a dead agent.
			c.restartStall()
			continue
		case wire.Chunk_KIND_ACCEPTED:
			c.onAccepted(ch)
		case wire.Chunk_KIND_FINAL:
			if ch.GetStage() == wire.Chunk_STAGE_PREFILL {
				// The prefill leg handed off: its decode job is queued.
				c.handedOff = c.b.now()
				c.timeHandOff(ch.GetRaw())
				c.restartStall()
				continue
			}
		}
		if ch.GetKind() == wire.Chunk_KIND_ERROR && recoverable(ch.GetError(), !c.firstToken.IsZero()) {
			if err := c.recover(ctx, fmt.Errorf("attempt %d on %s: %w", ch.GetAttempt(), ch.GetAgentId(), ch.GetError())); err != nil {
				return nil, err
			}
			continue
		}
		if c.migrations > 0 {
			c.continued(ch)
		}
		if ch.GetStage() == wire.Chunk_STAGE_PREFILL {
			if ch.GetKind() == wire.Chunk_KIND_ERROR {
				// The prefill leg failed after handing off: the request ends
				// (Close cancels the decode leg).
				c.ended.Store(true)
				c.outcome = OutcomeError
				return nil, fmt.Errorf("request %s: prefill leg on %s: %w", c.ID, ch.GetAgentId(), ch.GetError())
			}
			continue
		}
		return c.deliver(ch), nil
	}
}

// onAccepted takes in an agent's accepted chunk: the attempt's agent (or
// its prefill agent), what it counts in flight, affinity's settlement. It
// is the reader's.
func (c *Call) onAccepted(ch *wire.Chunk) {
	c.timeAccepted(ch)
	c.restartStall()
	// Copied: kept for the attempt, and by affinity for longer, where the
	// chunk's strings are its message's.
	if ch.GetStage() == wire.Chunk_STAGE_PREFILL {
		c.prefillAgent = strings.Clone(ch.GetAgentId())
		c.load.prefillTaken()
		c.accepted(c.prefillAgent, true)
		return
	}
	c.agent = strings.Clone(ch.GetAgentId())
	c.accepted(c.agent, false)
	if p := ch.GetPrefillAgent(); p != "" {
		c.prefillAgent = strings.Clone(p)
	}
	c.load.taken()
}

// release gives the chunk the reader last got back to the broker's pool.
func (c *Call) release() {
	if c.held != nil {
		c.b.putChunk(c.held)
		c.held = nil
	}
}

// deliver takes in ch, the chunk Next hands to the client: what the
// client got (clientTally), the metrics and timings of its tokens, and
// the outcome of a last chunk.
func (c *Call) deliver(ch *wire.Chunk) *wire.Chunk {
	switch ch.GetKind() {
	case wire.Chunk_KIND_TOKEN:
		events := ch.GetEvents()
		if len(events) == 0 {
			break
		}
		now := c.heard // when Next took it: a clock read per token saved
		if c.first(now, events) {
			c.b.obs(c.Model, c.Route).ttft.Observe(now.Sub(c.Started).Seconds())
		}
		// The observer is looked up once per route, not per token.
		if c.itl == nil || c.itlRoute != c.Route {
			c.itl, c.itlRoute = c.b.obs(c.Model, c.Route).itl, c.Route
		}
		c.gaps(now, len(events))
		c.timeToken(now, len(events))
		c.text(events)
	case wire.Chunk_KIND_FINAL:
		c.ended.Store(true)
		c.outcome = OutcomeOK
		if u := ch.GetUsage(); u != nil {
			c.tokens = int(u.GetCompletionTokens())
		}
		c.timeFinal(ch)
	case wire.Chunk_KIND_ERROR:
		c.ended.Store(true)
		c.outcome = errorOutcome(ch.GetError())
	}
	return ch
}

// Outcomes of a request, as the requests metric counts them.
const (
	OutcomeOK        = "ok"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
	// OutcomeShutdown: the broker's shutdown grace ended first (EndCalls).
	OutcomeShutdown = "shutdown"
)

// SetOutcome overrides the outcome recorded at Close, for ends the ingress
// sees first (the client went away, a broker-side error).
func (c *Call) SetOutcome(o string) { c.outcome = o }

// Close releases the call. If it has not ended it publishes a cancel so the
// agent aborts the engine request.
// The reader calls it, as it calls Next: it gives back the last chunk.
func (c *Call) Close() {
	if c.closed.Swap(true) {
		return
	}
	c.b.calls.Delete(c.ID)
	c.release()
	c.readerClock.stop()
	outcome := c.outcome
	if outcome == "" {
		outcome = OutcomeCancelled
	}
	c.logEnd(outcome)
	c.timeDone(outcome)
	m := c.b.metrics
	m.inflight.Dec()
	o := c.b.obs(c.Model, c.Route)
	o.request(m, outcome)
	o.e2e.Observe(time.Since(c.Started).Seconds())
	o.tokens.Add(float64(c.tokens))
	// A request that ended well needs no cancel; any other end may leave a
	// leg running (the prefill of a PD request whose decode failed, or the
	// engine request of a client that went away).
	if c.ended.Load() && outcome == OutcomeOK {
		c.load.release()
		return
	}
	c.mu.Lock()
	attempt := c.attempt
	c.mu.Unlock()
	c.cancelAttempt(attempt)
	c.dropJob()
	if outcome == OutcomeError {
		c.forget() // not a client that went away: its engine may cache the prompt
	}
	c.load.release()
}

// logEnd writes the one line per finished request: ids, route, agents,
// timings and size, never the prompt or the output.
func (c *Call) logEnd(outcome string) {
	log := c.b.log
	if !log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	var ttft time.Duration
	if !c.firstToken.IsZero() {
		ttft = c.firstToken.Sub(c.Started)
	}
	agents := strings.Join(appendAgents(c.ranOn[:len(c.ranOn):len(c.ranOn)], c.prefillAgent, c.agent), ",")
	log.LogAttrs(context.Background(), slog.LevelInfo, "request",
		slog.String("request_id", c.ID),
		slog.String("client_request_id", c.req.ClientRequestID),
		slog.String("model", c.Model),
		slog.String("route", c.Route.String()),
		slog.String("agents", agents),
		slog.Int("attempts", c.retries+c.migrations+1),
		slog.Int("migrations", c.migrations),
		slog.Duration("ttft", ttft),
		slog.Duration("duration", time.Since(c.Started)),
		slog.Int("tokens", c.tokens),
		slog.String("outcome", outcome),
	)
}
