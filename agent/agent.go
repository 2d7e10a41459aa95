package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// Agent serves one engine for one (model, pool).
type Agent struct {
	cfg    Config
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream
	engine Engine
	subj   subjects.Builder
	hbSubj string
	// decodeSubj is where a prefill agent publishes decode jobs.
	decodeSubj string

	state       atomic.Value // string: wire.State*
	readySince  atomic.Int64 // unix nanos
	active      atomic.Int32
	hbSeq       atomic.Uint32
	load        atomic.Pointer[Load]
	lastHandoff atomic.Int64 // unix nanos of the last decode job published
	stateCh     chan struct{}

	metrics *Metrics

	mu           sync.Mutex           // guards jobs, cancelled and drainExpired
	jobs         map[string][]heldJob // by request: a migrated request may have two attempts here a moment
	cancelled    map[string]cancelMark
	drainExpired bool // the drain timeout passed: jobs end as they register
}

// New returns an agent that serves engine over nc (owned by the caller).
func New(nc *nats.Conn, engine Engine, cfg Config, opts ...Option) (*Agent, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("agent: jetstream: %w", err)
	}
	a := &Agent{
		cfg:       cfg,
		log:       slog.Default(),
		nc:        nc,
		js:        js,
		engine:    engine,
		subj:      subjects.Must(cfg.Prefix),
		stateCh:   make(chan struct{}, 1),
		jobs:      make(map[string][]heldJob),
		cancelled: make(map[string]cancelMark),
	}
	a.hbSubj, _ = a.subj.Heartbeat(cfg.Model, cfg.Pool, cfg.ID)
	a.decodeSubj, _ = a.subj.Jobs(cfg.Model, subjects.PoolDecode)
	a.metrics = newMetrics(a)
	a.state.Store(wire.StateWarming)
	for _, o := range opts {
		o(a)
	}
	a.log = a.log.With("agent", cfg.ID, "model", cfg.Model, "pool", cfg.Pool)
	return a, nil
}

// ID returns the agent's id.
func (a *Agent) ID() string { return a.cfg.ID }

// Active returns the number of jobs held now.
func (a *Agent) Active() int { return int(a.active.Load()) }

// State returns the agent's state: warming, ready or draining.
func (a *Agent) State() string { return a.state.Load().(string) }

func (a *Agent) setState(s string) {
	if a.state.Swap(s) != s {
		if s == wire.StateReady {
			a.readySince.Store(time.Now().UnixNano())
		}
		select {
		case a.stateCh <- struct{}{}:
		default:
		}
	}
}

// Run serves until ctx ends, then drains: it announces "draining", stops
// pulling, finishes the jobs it holds and returns nil. Jobs are not
// cancelled by ctx; cancel them through NATS or let them finish.
func (a *Agent) Run(ctx context.Context) error {
	cancelSub, err := a.nc.Subscribe(a.subj.CancelAll(), a.onCancel)
	if err != nil {
		return fmt.Errorf("agent: subscribe cancels: %w", err)
	}
	defer func() { _ = cancelSub.Unsubscribe() }()

	hbDone := make(chan struct{})
	hbCtx, stopHB := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(hbDone)
		a.heartbeatLoop(hbCtx)
	}()
	defer func() {
		stopHB()
		<-hbDone
	}()

	if err := a.waitHealthy(ctx); err != nil {
		return nil // ctx ended while warming: nothing held, nothing to drain
	}
	cons, err := a.consumer(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	ref := &consumerRef{cons: cons}
	a.setState(wire.StateReady)
	a.log.Info("agent ready", "slots", a.cfg.Slots)

	var jobs sync.WaitGroup
	pulled := make(chan struct{})
	go func() {
		defer close(pulled)
		a.pull(ctx, ref, &jobs)
	}()
	<-ctx.Done()
	drainStart := time.Now()
	a.setState(wire.StateDraining)
	a.log.Info("agent draining", "active", a.Active())
	a.waitJobs(pulled, &jobs, drainStart)
	// A prefill engine keeps each hand-off (KV cache, bootstrap room) for
	// its decode leg; stay up until the last one has had time to be taken.
	if last := a.lastHandoff.Load(); last != 0 {
		if wait := time.Until(time.Unix(0, last).Add(a.cfg.HandoffGrace)); wait > 0 {
			a.log.Info("waiting for decode legs to take the last hand-offs", "wait", wait)
			time.Sleep(wait)
		}
	}
	a.log.Info("agent drained")
	return nil
}

// waitJobs waits for the pull loop to stop (it may sit in a pull request
// for up to PullWait) and the jobs held to end; with a DrainTimeout, only
// until it has passed since the drain began: then it ends the rest with
// errDrainTimeout (a retryable error the broker repairs on another agent)
// and waits for them to report it.
func (a *Agent) waitJobs(pulled <-chan struct{}, jobs *sync.WaitGroup, since time.Time) {
	done := make(chan struct{})
	go func() {
		<-pulled // no job is added after this
		jobs.Wait()
		close(done)
	}()
	if a.cfg.DrainTimeout <= 0 {
		<-done
		return
	}
	t := time.NewTimer(time.Until(since.Add(a.cfg.DrainTimeout)))
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	a.mu.Lock()
	a.drainExpired = true // a job registering from now on ends at once
	var cancels []context.CancelCauseFunc
	for _, held := range a.jobs {
		for _, j := range held {
			cancels = append(cancels, j.cancel)
		}
	}
	a.mu.Unlock()
	a.log.Warn("drain timeout: ending the jobs still running; the broker continues them on other agents",
		"jobs", len(cancels), "timeout", a.cfg.DrainTimeout)
	for _, cancel := range cancels {
		cancel(errDrainTimeout)
	}
	<-done
}

var errDrainTimeout = errors.New("agent drain timeout")

func (a *Agent) waitHealthy(ctx context.Context) error {
	hc, ok := a.engine.(HealthChecker)
	if !ok {
		return nil
	}
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := hc.Health(hctx)
		cancel()
		if err == nil {
			return nil
		}
		a.log.Info("engine not healthy yet", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// consumer binds to the pool's shared durable consumer, creating it if this
// is the pool's first agent, and waits for the broker's stream to exist.
func (a *Agent) consumer(ctx context.Context) (jetstream.Consumer, error) {
	name, err := subjects.ConsumerName(a.cfg.Model, a.cfg.Pool)
	if err != nil {
		return nil, err
	}
	filter, err := a.subj.Jobs(a.cfg.Model, a.cfg.Pool)
	if err != nil {
		return nil, err
	}
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		// A request sent while NATS goes away gets no answer: bound each
		// try so the consumer is bound soon after the server is back, not
		// after a whole JetStream timeout.
		actx, cancel := context.WithTimeout(ctx, time.Second)
		cons, err := a.js.CreateOrUpdateConsumer(actx, a.cfg.Stream, jetstream.ConsumerConfig{
			Durable:       name,
			FilterSubject: filter,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       a.cfg.AckWait,
			MaxAckPending: -1,
			// Many agents share the consumer, each with one waiting pull
			// request at a time.
			MaxWaiting: 4096,
		})
		cancel()
		if err == nil {
			return cons, nil
		}
		a.log.Warn("jobs consumer not ready, retrying", "stream", a.cfg.Stream, "consumer", name, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// consumerRef is the pool's consumer as the agent's slots share it. When a
// pull shows the consumer gone (a NATS server restarted on an empty store,
// a stream recreated, a consumer deleted by hand), the first slot to notice
// binds it again and the others wait for that rather than each asking.
type consumerRef struct {
	mu   sync.Mutex // held while the consumer is being bound again
	cons jetstream.Consumer
	gen  int
}

func (r *consumerRef) get() (jetstream.Consumer, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cons, r.gen
}

// renew binds the consumer again unless another slot already did since gen.
func (r *consumerRef) renew(ctx context.Context, a *Agent, gen int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen != gen {
		return
	}
	a.log.Warn("jobs consumer gone, binding it again", "stream", a.cfg.Stream)
	cons, err := a.consumer(ctx)
	if err != nil {
		return // ctx ended
	}
	r.cons = cons
	r.gen++
	a.log.Info("jobs consumer bound again", "stream", a.cfg.Stream)
}

// consumerGone reports whether a pull error means the consumer (or its
// stream) no longer exists. No responders also happens for a moment while
// a cluster elects a consumer leader; binding again is idempotent, so that
// costs one extra request.
func consumerGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrNoResponders)
}

// pullRetryMax bounds the wait between failed pulls: NATS away, a
// consumer being bound again. Reconnects are every 250ms, so pulling resumes
// within about this once NATS is back.
const pullRetryMax = time.Second

// pull is the agent's one pull loop: it asks the pool's consumer for as
// many jobs as it has free slots and runs each in its own goroutine. Pull
// failures back off (a pull that fails at once must not spin) and a
// consumer found gone is bound again.
func (a *Agent) pull(ctx context.Context, ref *consumerRef, jobs *sync.WaitGroup) {
	// One token per free slot: a pull asks for exactly the slots it holds,
	// so the agent can never hold more jobs than slots, and it keeps one
	// pull request waiting at the server instead of one per idle slot.
	free := make(chan struct{}, a.cfg.Slots)
	for range a.cfg.Slots {
		free <- struct{}{}
	}
	backoff := time.Duration(0)
	pause := func() {
		backoff = min(max(2*backoff, 50*time.Millisecond), pullRetryMax)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
	for ctx.Err() == nil {
		select {
		case <-free:
		case <-ctx.Done():
			return
		}
		n := 1
	more:
		for n < a.cfg.Slots {
			select {
			case <-free:
				n++
			default:
				break more
			}
		}
		cons, gen := ref.get()
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(a.cfg.PullWait))
		if err != nil {
			for range n {
				free <- struct{}{}
			}
			if ctx.Err() == nil {
				a.log.Warn("pull failed", "err", err)
				pause()
			}
			continue
		}
		// A batch ends when it has n jobs or expires; while it has fewer,
		// every job that arrives is delivered to it at once.
		got := 0
		for msg := range batch.Messages() {
			if ctx.Err() != nil {
				// Draining: hand the job straight back to the pool.
				_ = msg.Nak()
				continue
			}
			got++
			jobs.Add(1)
			go func() {
				defer jobs.Done()
				defer func() { free <- struct{}{} }()
				a.handle(ctx, msg)
			}()
		}
		for range n - got {
			free <- struct{}{}
		}
		err = batch.Error()
		switch {
		case err == nil || errors.Is(err, nats.ErrTimeout) || ctx.Err() != nil:
			backoff = 0
		case consumerGone(err):
			ref.renew(ctx, a, gen)
			backoff = 0 // bound again: pull again soon
			pause()
		default:
			a.log.Debug("pull ended", "err", err)
			pause()
		}
	}
}

// doubleAck acks a job and waits for the server's confirmation, but no
// longer than the consumer's AckWait: an ack lost in a NATS failover (its
// request went to the node that died) gets no answer, and past AckWait the
// job is offered to another agent anyway, so waiting for the job's whole
// deadline would only hold the slot.
func (a *Agent) doubleAck(ctx context.Context, msg jetstream.Msg) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.AckWait)
	defer cancel()
	return msg.DoubleAck(ctx)
}

// cancelledTTL is how long a cancel is remembered for jobs not yet pulled.
const cancelledTTL = 5 * time.Minute

// onCancel handles sy.cancel.<request>. The payload, when present, is the
// highest attempt to cancel (decimal): the broker cancels an abandoned
// attempt without touching the retry that replaces it. No payload cancels
// every attempt.
func (a *Agent) onCancel(m *nats.Msg) {
	id, err := a.subj.ParseCancel(m.Subject)
	if err != nil {
		return
	}
	upTo := uint32(math.MaxUint32)
	if len(m.Data) > 0 {
		n, err := strconv.ParseUint(string(m.Data), 10, 32)
		if err != nil {
			return
		}
		upTo = uint32(n)
	}
	now := time.Now()
	a.mu.Lock()
	var cancels []context.CancelCauseFunc
	for _, j := range a.jobs[id] {
		if j.attempt <= upTo {
			cancels = append(cancels, j.cancel)
		}
	}
	if c, ok := a.cancelled[id]; !ok || upTo > c.upTo {
		a.cancelled[id] = cancelMark{upTo: upTo, at: now}
	}
	if len(a.cancelled) > 1024 {
		for k, c := range a.cancelled {
			if now.Sub(c.at) > cancelledTTL {
				delete(a.cancelled, k)
			}
		}
	}
	a.mu.Unlock()
	for _, cancel := range cancels {
		cancel(errCancelled)
	}
}

var errCancelled = errors.New("cancelled by the broker")

// drainedError ends a job cut short by the drain timeout: retryable, since
// before its first token nothing reached the client, and after it the
// broker migrates the stream.
func drainedError(agentID string) *wire.Error {
	return &wire.Error{Code: wire.CodeDraining, Message: "agent " + agentID + " drained before the request finished", Retryable: true}
}

type cancelMark struct {
	upTo uint32
	at   time.Time
}

type heldJob struct {
	attempt uint32
	cancel  context.CancelCauseFunc
}

func (a *Agent) wasCancelled(id string, attempt uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.cancelled[id]
	return ok && attempt <= c.upTo
}

// handle runs one job to its end.
func (a *Agent) handle(ctx context.Context, msg jetstream.Msg) {
	job := new(wire.Job)
	if err := proto.Unmarshal(msg.Data(), job); err != nil {
		a.log.Warn("undecodable job dropped", "err", err)
		_ = msg.Term()
		return
	}
	out := newStream(a, job)
	if dl := job.GetDeadline(); dl != nil && time.Now().After(dl.AsTime()) {
		a.metrics.jobs.WithLabelValues(JobExpired).Inc()
		_ = msg.Term()
		out.fail(&wire.Error{Code: wire.CodeDeadlineExceeded, Message: "job deadline passed before it started"})
		return
	}
	if a.wasCancelled(job.GetRequestId(), job.GetAttempt()) {
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		_ = msg.Term()
		return
	}
	actx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	if dl := job.GetDeadline(); dl != nil {
		var c2 context.CancelFunc
		actx, c2 = context.WithDeadline(actx, dl.AsTime())
		defer c2()
	}
	prefill := a.cfg.Pool == subjects.PoolPrefill
	if prefill {
		if err := a.doubleAck(actx, msg); err != nil {
			// Not confirmed: the job may already be with another agent.
			a.log.Warn("job ack failed, dropping it", "request", job.GetRequestId(), "err", err)
			return
		}
	} else {
		// Speak at once: accepted now, tokens as the engine makes them. The
		// ack's round trip overlaps the engine's work instead of delaying
		// the first token. Should two agents ever run one attempt (an ack
		// lost in a NATS failover, the job redelivered after AckWait), the
		// broker listens only to the first that spoke for it.
		if err := out.send(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED, PrefillAgent: job.GetPd().GetPrefillAgent()}); err != nil {
			a.log.Warn("accepted chunk not sent", "request", job.GetRequestId(), "err", err)
		}
		// A plain ack: nothing waits for its confirmation any more, so the
		// server's reply would only cost a message and a goroutine per job.
		if err := msg.Ack(); err != nil {
			a.log.Warn("job ack not sent", "request", job.GetRequestId(), "err", err)
		}
	}
	// Held by request and attempt: a stream migrated to this same agent
	// starts its new attempt while the old one may still be ending, and
	// each must stay reachable by its own cancel.
	id, attempt := job.GetRequestId(), job.GetAttempt()
	a.mu.Lock()
	a.jobs[id] = append(a.jobs[id], heldJob{attempt: attempt, cancel: cancel})
	// A cancel that came after the check above but before this found no
	// job to stop; it is on record, so honour it here.
	mark, cancelled := a.cancelled[id]
	drainExpired := a.drainExpired
	a.mu.Unlock()
	switch {
	case cancelled && attempt <= mark.upTo:
		cancel(errCancelled)
	case drainExpired:
		cancel(errDrainTimeout)
	}
	a.active.Add(1)
	defer func() {
		a.active.Add(-1)
		a.mu.Lock()
		held := slices.DeleteFunc(a.jobs[id], func(h heldJob) bool { return h.attempt == attempt })
		if len(held) == 0 {
			delete(a.jobs, id)
		} else {
			a.jobs[id] = held
		}
		a.mu.Unlock()
	}()
	// A PD leg's body is built by the PD adapter from the job's, in one
	// pass with its hand-off fields; any other job streams from its engine.
	body := job.GetBody()
	var err error
	if !prefill && job.GetPd() == nil {
		if body, err = oaiformat.StreamingBody(body); err != nil {
			out.fail(&wire.Error{Code: wire.CodeBadRequest, Message: "job body: " + err.Error()})
			return
		}
	}
	req := &Request{RequestID: job.GetRequestId(), API: job.GetApi(), Body: body, Job: job}
	if prefill {
		a.prefill(actx, req, out)
		return
	}
	out.called = time.Now()
	err = a.engine.Stream(actx, req, out.emit)
	a.metrics.duration.Observe(time.Since(out.called).Seconds())
	switch {
	case err == nil:
		a.metrics.jobs.WithLabelValues(JobOK).Inc()
		out.finish()
	case context.Cause(actx) == errCancelled:
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		a.log.Debug("job cancelled", "request", job.GetRequestId())
	case context.Cause(actx) == errDrainTimeout:
		a.metrics.jobs.WithLabelValues(JobDrained).Inc()
		a.log.Info("job ended by the drain timeout", "request", job.GetRequestId(), "tokens", out.tokens)
		out.fail(drainedError(a.cfg.ID))
	case errors.Is(actx.Err(), context.DeadlineExceeded):
		a.metrics.jobs.WithLabelValues(JobExpired).Inc()
		out.fail(&wire.Error{Code: wire.CodeDeadlineExceeded, Message: "request deadline exceeded in the engine"})
	default:
		a.metrics.jobs.WithLabelValues(JobError).Inc()
		var we *wire.Error
		if !errors.As(err, &we) {
			we = &wire.Error{Code: wire.CodeEngine, Message: err.Error()}
		}
		// Safe to run again elsewhere only if the client saw nothing and the
		// engine did not judge the request itself bad.
		we.Retryable = out.tokens == 0 && we.Code != wire.CodeBadRequest
		a.log.Warn("engine request failed", "request", job.GetRequestId(), "err", err)
		out.fail(we)
	}
}

// prefill runs the prefill leg of a PD job and publishes its decode job.
// It reports on the reply subject only in the prefill stage: accepted, and
// an error if the leg fails; the decode agent owns the token stream.
func (a *Agent) prefill(ctx context.Context, req *Request, out *stream) {
	out.stage = wire.Chunk_STAGE_PREFILL
	out.send(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
	pf, ok := a.engine.(Prefiller)
	if !ok {
		out.fail(&wire.Error{Code: wire.CodeInternal, Message: "agent " + a.cfg.ID + " has no prefill-capable engine"})
		return
	}
	handedOff := false
	handoff := func(h *wire.PDHandoff) error {
		if handedOff {
			return errors.New("agent: handoff called twice")
		}
		handedOff = true
		a.lastHandoff.Store(time.Now().UnixNano())
		return a.publishDecode(ctx, req.Job, h)
	}
	err := pf.Prefill(ctx, req, handoff)
	if err == nil && !handedOff {
		err = errors.New("prefill finished without a hand-off")
	}
	switch {
	case err == nil:
		a.metrics.jobs.WithLabelValues(JobHandedOff).Inc()
		out.ended = true
	case context.Cause(ctx) == errCancelled:
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		a.log.Debug("prefill cancelled", "request", req.RequestID)
	case context.Cause(ctx) == errDrainTimeout && !handedOff:
		a.metrics.jobs.WithLabelValues(JobDrained).Inc()
		out.fail(drainedError(a.cfg.ID))
	default:
		a.metrics.jobs.WithLabelValues(JobError).Inc()
		var we *wire.Error
		if !errors.As(err, &we) {
			we = &wire.Error{Code: wire.CodeEngine, Message: "prefill leg: " + err.Error()}
		}
		we.Retryable = !handedOff && we.Code != wire.CodeBadRequest
		a.log.Warn("prefill leg failed", "request", req.RequestID, "err", err)
		out.fail(we)
	}
}

// publishDecode sends the decode leg of job to the model's decode queue.
func (a *Agent) publishDecode(ctx context.Context, job *wire.Job, h *wire.PDHandoff) error {
	dj := proto.Clone(job).(*wire.Job)
	h = proto.Clone(h).(*wire.PDHandoff)
	h.PrefillAgent = a.cfg.ID
	if h.Protocol == "" {
		h.Protocol = a.cfg.PDProtocol
	}
	dj.Pd = h
	data, err := proto.Marshal(dj)
	if err != nil {
		return err
	}
	if _, err := a.js.Publish(ctx, a.decodeSubj, data); err != nil {
		return &wire.Error{Code: wire.CodeEngineDown, Message: "publishing the decode job: " + err.Error()}
	}
	return nil
}

func (a *Agent) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	a.publishHeartbeat(ctx)
	for {
		select {
		case <-ctx.Done():
			a.publishHeartbeat(context.Background()) // the last word: draining, active 0
			_ = a.nc.FlushTimeout(time.Second)
			return
		case <-t.C:
		case <-a.stateCh:
		}
		a.publishHeartbeat(ctx)
	}
}

func (a *Agent) publishHeartbeat(ctx context.Context) {
	if lr, ok := a.engine.(LoadReporter); ok && ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, a.cfg.Heartbeat/2)
		if l, err := lr.Load(lctx); err == nil {
			a.load.Store(&l)
		}
		cancel()
	}
	hb := a.Heartbeat()
	data, err := wire.MarshalHeartbeat(hb)
	if err != nil {
		a.log.Error("heartbeat encode", "err", err)
		return
	}
	if err := a.nc.Publish(a.hbSubj, data); err != nil {
		a.metrics.hbErrors.Inc()
		a.log.Warn("heartbeat publish failed", "err", err)
	}
}

// Heartbeat returns the heartbeat the agent would publish now.
func (a *Agent) Heartbeat() *wire.Heartbeat {
	hb := &wire.Heartbeat{
		AgentId:   a.cfg.ID,
		Model:     a.cfg.Model,
		Pool:      a.cfg.Pool,
		Engine:    a.cfg.Engine,
		Transport: a.cfg.Transport,
		State:     a.State(),
		Slots:     uint32(a.cfg.Slots),
		Active:    uint32(max(0, a.Active())),
		Interval:  durationpb.New(a.cfg.Heartbeat),
		Seq:       a.hbSeq.Add(1),
		Version:   a.cfg.Version,
		SentAt:    timestamppb.Now(),
	}
	if a.cfg.Pool != subjects.PoolRegular {
		hb.PdProtocol = a.cfg.PDProtocol
	}
	if a.cfg.Pool == subjects.PoolPrefill && a.cfg.BootstrapPort != 0 {
		hb.BootstrapHost = a.cfg.BootstrapHost
		hb.BootstrapPort = uint32(a.cfg.BootstrapPort)
	}
	if rs := a.readySince.Load(); rs != 0 {
		hb.ReadySince = timestamppb.New(time.Unix(0, rs))
	}
	if l := a.load.Load(); l != nil {
		hb.EngineRunning = proto.Uint32(uint32(l.Running))
		hb.EngineWaiting = proto.Uint32(uint32(l.Waiting))
		hb.KvCacheUsage = proto.Float64(l.KVCacheUsage)
	}
	return hb
}
