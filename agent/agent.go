package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/natsx"
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
	// pair is a PD agent's pairing key (protocol and labels); decodeSubj
	// is where a prefill agent publishes decode jobs: the decode queue of
	// its own pairing, which only decode agents that can take its
	// hand-offs pull.
	pair       string
	decodeSubj string
	// decodeBatchSubj is decodeSubj's batch-class queue (see batchclass.go).
	decodeBatchSubj string
	batch           batchSched

	state       atomic.Pointer[stateInfo]
	readySince  atomic.Int64 // unix nanos
	active      atomic.Int32
	hbSeq       atomic.Uint32
	load        atomic.Pointer[Load]
	lastHandoff atomic.Int64 // unix nanos of the last decode job published
	stateCh     chan struct{}
	gate        gate // out of service while the engine refuses the agent
	avoid       avoidList
	// slots counts the jobs held from the shared and the directed queue
	// together, against the one pull limit (see directed.go).
	slots slotCount

	metrics *Metrics
	out     *outbox // chunks to brokers, gathered per broker

	// KV-event translation (Config.KVEventsHash vllm; kvforward.go): nil
	// kvt means the events are forwarded as they are.
	kvt       *kvTranslator
	tokenizer PromptTokenizer
	kvSubj    string
	tokSem    chan struct{} // bounds the tokenize calls in flight
	tokWG     sync.WaitGroup

	mu           sync.Mutex           // guards jobs, ended, cancelled, drainExpired and running
	jobs         map[string][]heldJob // by request: a migrated request may have two attempts here a moment
	ended        []endedStream        // streams that ended within resendWindow, oldest first
	cancelled    map[string]cancelMark
	drainExpired bool // the drain timeout passed: jobs end as they register
	// running holds the (request, attempt) of every job handled now, and
	// of every job that reached its engine within dupWindow (by when it
	// ended; ranOrder oldest first), so that a second copy of one (an
	// affinity offer and the shared copy it moved to, both pulled here;
	// the decode job of a second prefill leg) is not run twice.
	running  map[attemptKey]time.Time
	ranOrder []attemptKey
}

type attemptKey struct {
	request string
	attempt uint32
}

// resendWindow is how long after its end a stream's last chunk is sent
// again at a reconnect: its final may have been lost with the NATS node
// the agent was connected to.
const resendWindow = 10 * time.Second

// dupWindow is how long an attempt that ran here is remembered after its
// end. A second copy comes from a race that ends within the race's own
// messages (an offer moved as its agent took it, a second prefill leg
// stopped only after its hand-off), well within a hand-off's KV hold.
const dupWindow = DefaultKVHold

// ranHere records that attempt k ran to its end here now: a copy taken
// later is a duplicate. The key is cloned (the job's id aliases its
// message) and records older than dupWindow go. a.mu is held.
func (a *Agent) ranHere(k attemptKey, now time.Time) {
	k.request = strings.Clone(k.request)
	a.running[k] = now
	a.ranOrder = append(a.ranOrder, k)
	i := 0
	for i < len(a.ranOrder) && now.Sub(a.running[a.ranOrder[i]]) >= dupWindow {
		delete(a.running, a.ranOrder[i])
		i++
	}
	a.ranOrder = a.ranOrder[i:]
}

// endedStream is the last chunk of a stream that ended (a final or an
// error: small), kept instead of the stream and its buffers.
type endedStream struct {
	at      time.Time
	subject string
	last    []byte
}

// resendAfterReconnect sends the last chunk of every stream held or ended
// within resendWindow again each time the connection comes back (see
// stream.resend).
func (a *Agent) resendAfterReconnect(ctx context.Context) {
	status := a.nc.StatusChanged(nats.CONNECTED)
	defer a.nc.RemoveStatusListener(status)
	for {
		select {
		case <-ctx.Done():
			return
		case <-status:
		}
		// Once at once, and once more a moment later: the broker may be
		// reconnecting too (its node may be the one lost), and a chunk
		// sent before its subscription is known on the agent's new node
		// is lost again.
		a.resendRecent()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		a.resendRecent()
	}
}

// resendRecent sends the last chunk of every stream held or ended within
// resendWindow again.
func (a *Agent) resendRecent() {
	now := time.Now()
	var outs []*stream
	var ended []endedStream
	a.mu.Lock()
	for _, held := range a.jobs {
		for _, j := range held {
			outs = append(outs, j.out)
		}
	}
	for _, e := range a.ended {
		if now.Sub(e.at) < resendWindow {
			ended = append(ended, e)
		}
	}
	a.mu.Unlock()
	if len(outs)+len(ended) > 0 {
		a.log.Info("NATS reconnected: sending the last chunk of each recent stream again", "streams", len(outs)+len(ended))
	}
	for _, out := range outs {
		out.resend()
	}
	for _, e := range ended {
		if err := a.nc.Publish(e.subject, e.last); err != nil {
			a.log.Debug("chunk not sent again", "subject", e.subject, "err", err)
		}
	}
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
		running:   make(map[attemptKey]time.Time),
	}
	a.hbSubj, _ = a.subj.Heartbeat(cfg.Model, cfg.Pool, cfg.ID)
	a.pair = cfg.pairKey()
	if a.pair != "" {
		a.decodeSubj, _ = a.subj.PDJobs(cfg.Model, subjects.PoolDecode, a.pair)
		a.decodeBatchSubj, _ = a.subj.BatchJobs(cfg.Model, subjects.PoolDecode, a.pair)
	}
	a.metrics = newMetrics(a)
	a.out = newOutbox(nc, a.cfg.ReplyLinger, a.metrics.replyMsgs, a.metrics.replyChunks)
	a.state.Store(&stateInfo{state: wire.StateWarming, reason: "starting: engine not checked yet"})
	for _, o := range opts {
		o(a)
	}
	a.log = a.log.With("agent", cfg.ID, "model", cfg.Model, "pool", cfg.Pool)
	if err := a.setupKVTranslation(); err != nil {
		return nil, err
	}
	return a, nil
}

// ID returns the agent's id.
func (a *Agent) ID() string { return a.cfg.ID }

// Active returns the number of jobs held now.
func (a *Agent) Active() int { return int(a.active.Load()) }

// State returns the agent's state: warming, ready or draining.
func (a *Agent) State() string { return a.state.Load().state }

// StateReason says why the agent does not serve now ("engine not healthy
// yet: ..."); empty while it serves.
func (a *Agent) StateReason() string { return a.state.Load().reason }

// stateInfo is a state and why the agent is in it, swapped as one.
type stateInfo struct{ state, reason string }

// setState moves the agent to state, for reason (empty when it serves),
// and announces a change in a heartbeat at once.
func (a *Agent) setState(state, reason string) {
	old := a.state.Swap(&stateInfo{state: state, reason: reason})
	if old.state == state && old.reason == reason {
		return
	}
	if state == wire.StateReady && old.state != wire.StateReady {
		a.readySince.Store(time.Now().UnixNano())
	}
	select {
	case a.stateCh <- struct{}{}:
	default:
	}
}

// PullLimit returns the most jobs the agent holds now: its slots, bounded
// while it ramps up by the slow-start rule the broker weighs it with
// (never below one job). Zero while it does not pull.
func (a *Agent) PullLimit() int {
	if a.State() != wire.StateReady {
		return 0
	}
	return a.pullLimit(time.Now())
}

func (a *Agent) pullLimit(now time.Time) int {
	var since time.Time
	if rs := a.readySince.Load(); rs != 0 {
		since = time.Unix(0, rs)
	}
	return max(1, int(math.Floor(dispatch.Ramp(a.cfg.Slots, since, now, a.cfg.ramp()))))
}

// ramping reports whether the pull limit may still grow, and how often to
// look again: a few times per slot the ramp adds.
func (a *Agent) ramping(now time.Time) (time.Duration, bool) {
	rs := a.readySince.Load()
	if a.cfg.SlowStart <= 0 || rs == 0 || !now.Before(time.Unix(0, rs).Add(a.cfg.SlowStart)) {
		return 0, false
	}
	return max(a.cfg.SlowStart/time.Duration(4*a.cfg.Slots), 10*time.Millisecond), true
}

// Run serves until ctx ends, then drains: it announces "draining", stops
// pulling, finishes the jobs it holds and returns nil. Jobs are not
// cancelled by ctx; cancel them through NATS or let them finish.
func (a *Agent) Run(ctx context.Context) error {
	// Stopped last: what the last jobs said is flushed before Run returns.
	stopOut := a.out.start()
	defer stopOut()
	cancelSub, err := a.nc.Subscribe(a.subj.CancelAll(), a.onCancel)
	if err != nil {
		return fmt.Errorf("agent: subscribe cancels: %w", err)
	}
	defer func() { _ = cancelSub.Unsubscribe() }()

	hbDone, resendDone := make(chan struct{}), make(chan struct{})
	hbCtx, stopHB := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(hbDone)
		a.heartbeatLoop(hbCtx)
	}()
	go func() {
		defer close(resendDone)
		a.resendAfterReconnect(hbCtx)
	}()
	defer func() {
		stopHB()
		<-hbDone
		<-resendDone
	}()

	defer a.tokWG.Wait() // tokenize calls are bounded by their timeout
	if a.cfg.KVEvents != "" {
		kvDone := make(chan struct{})
		kvCtx, stopKV := context.WithCancel(ctx)
		go func() {
			defer close(kvDone)
			a.forwardKV(kvCtx)
		}()
		defer func() {
			stopKV()
			<-kvDone
		}()
	}
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
	a.setState(wire.StateReady, "")
	a.log.Info("agent ready", "slots", a.cfg.Slots, "pair", a.pair)

	var jobs sync.WaitGroup
	pulled := make(chan struct{})
	go func() {
		defer close(pulled)
		a.pullAll(ctx, ref, &jobs)
	}()
	<-ctx.Done()
	drainStart := time.Now()
	a.setState(wire.StateDraining, "stopping: finishing the jobs it holds")
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
		reason := healthReason(err)
		if a.StateReason() != reason && errors.Is(err, &wire.Error{Code: wire.CodeEngineMisconfigured}) {
			a.log.Error("engine refuses the agent; it will not become ready until this is fixed", "reason", reason)
		} else {
			a.log.Info("engine not healthy yet", "err", err)
		}
		a.setState(wire.StateWarming, reason)
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
	name, filter, err := a.queue()
	if err != nil {
		return nil, err
	}
	return a.bindConsumer(ctx, a.cfg.Stream, name, filter, 0)
}

// bindConsumer creates or binds the durable consumer name on filter; an
// inactive threshold above zero lets JetStream delete it once nobody has
// pulled it that long (an agent's own directed queue).
func (a *Agent) bindConsumer(ctx context.Context, stream, name, filter string, inactive time.Duration) (jetstream.Consumer, error) {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		// A request sent while NATS goes away gets no answer: bound each
		// try so the consumer is bound soon after the server is back, not
		// after a whole JetStream timeout.
		actx, cancel := context.WithTimeout(ctx, time.Second)
		cons, err := a.js.CreateOrUpdateConsumer(actx, stream, jetstream.ConsumerConfig{
			Durable:       name,
			FilterSubject: filter,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       a.cfg.AckWait,
			MaxAckPending: -1,
			// Many agents share the consumer, each with one waiting pull
			// request at a time.
			MaxWaiting:        4096,
			InactiveThreshold: inactive,
		})
		cancel()
		if err == nil {
			return cons, nil
		}
		// A try that timed out says nothing of why: the permission the
		// server denied (a NATS user that does not fit the agent's
		// --role), or a consumer without a leader, is what an operator
		// needs to see.
		err = a.consumerCause(ctx, stream, name, err)
		a.log.Warn("jobs consumer not ready, retrying", "stream", stream, "consumer", name, "err", err)
		if a.State() == wire.StateWarming {
			a.setState(wire.StateWarming, "jobs queue not ready: "+err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// queue returns the durable consumer and the subject the agent pulls: its
// pool's queue, or for a PD agent its pool's queue of its own pairing.
func (a *Agent) queue() (name, filter string, err error) {
	if a.pair == "" {
		if name, err = subjects.ConsumerName(a.cfg.Model, a.cfg.Pool); err != nil {
			return "", "", err
		}
		filter, err = a.subj.Jobs(a.cfg.Model, a.cfg.Pool)
		return name, filter, err
	}
	if name, err = subjects.PDConsumerName(a.cfg.Model, a.cfg.Pool, a.pair); err != nil {
		return "", "", err
	}
	filter, err = a.subj.PDJobs(a.cfg.Model, a.cfg.Pool, a.pair)
	return name, filter, err
}

// doubleAck acks a job and waits for the server's confirmation, but no
// longer than the consumer's AckWait: an ack lost in a NATS failover (its
// request went to the node that died) gets no answer, and past AckWait the
// job is offered to another agent anyway, so waiting for the job's whole
// deadline would only hold the slot.
func (a *Agent) doubleAck(ctx context.Context, msg jobMessage) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.AckWait)
	defer cancel()
	return msg.DoubleAck(ctx)
}

// cancelledTTL is how long a cancel is remembered for jobs not yet pulled.
const cancelledTTL = 5 * time.Minute

// onCancel handles sy.cancel.<request> (payload: wire.ParseCancel). It
// names the highest attempt to cancel: the broker cancels an abandoned
// attempt without touching the retry that replaces it. It may name an
// agent: when two agents run one attempt, the broker stops the one whose
// stream it does not relay, and the other ignores it.
func (a *Agent) onCancel(m *nats.Msg) {
	id, err := a.subj.ParseCancel(m.Subject)
	if err != nil {
		return
	}
	upTo, agent, err := wire.ParseCancel(m.Data)
	if err != nil || (agent != "" && agent != a.cfg.ID) {
		return
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
	out     *stream
}

func (a *Agent) wasCancelled(id string, attempt uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.cancelled[id]
	return ok && attempt <= c.upTo
}

// jobRun is what handle makes for one job, in one allocation: the job,
// its stream, its prefill state, its accepted chunk, its engine request
// and what handle's steps learn of it. Nothing is reused: what outlives
// handle (a stream kept by a late cancel, a context an engine still holds)
// keeps it alive.
type jobRun struct {
	job      wire.Job
	out      stream
	pf       prefillState
	accepted wire.Chunk
	req      Request

	msg     jobMessage
	key     attemptKey
	prefill bool // a PD job's prefill leg
	// pdDecode: a decode leg, carrying a hand-off whose KV the prefill
	// engine holds until a decode reads it (or its hold ends).
	pdDecode bool
	// release: a decode leg that only takes its hand-off, in silence (its
	// request was cancelled while its prefill ran, or it is a second
	// decode leg of one attempt).
	release   bool
	cancelled bool
	ran       bool // the job reached its engine
}

// handle runs one job to its end, in a context under base, which carries
// no cancel (see jobContext): it admits the job (decoded, not expired,
// the agent serving), claims its attempt, accepts it, holds it where a
// cancel finds it, calls the engine and reports the outcome.
func (a *Agent) handle(base context.Context, msg jobMessage) {
	run := a.admit(msg)
	if run == nil || !a.claim(run) {
		return
	}
	defer a.unclaim(run)
	if run.cancelled && !a.takeCancelled(run) {
		return
	}
	var deadline time.Time
	if dl := run.job.GetDeadline(); dl != nil {
		deadline = dl.AsTime()
	}
	ctx, cancel := jobContext(base, deadline)
	defer cancel(nil)
	defer run.out.quiet()
	if !a.accept(ctx, run) {
		return
	}
	run.ran = true
	stop := a.stopper(run, cancel)
	a.hold(run, stop)
	defer a.unhold(run)
	defer a.holdBatch(run, stop)()
	a.callEngine(ctx, run)
}

// admit decodes a job and checks that it may start: its deadline and, for
// a decode leg, its hand-off's KV hold have not passed, and the agent
// serves. It returns nil for a job it ended here.
func (a *Agent) admit(msg jobMessage) *jobRun {
	run := &jobRun{msg: msg}
	job := &run.job
	if err := proto.Unmarshal(msg.Data(), job); err != nil {
		a.log.Warn("undecodable job dropped", "err", err)
		_ = msg.Term()
		return nil
	}
	out := &run.out
	out.init(a, job)
	run.key = attemptKey{job.GetRequestId(), job.GetAttempt()}
	now := time.Now()
	if dl := job.GetDeadline(); dl != nil && now.After(dl.AsTime()) {
		a.metrics.jobs.WithLabelValues(JobExpired).Inc()
		_ = msg.Term()
		out.fail(&wire.Error{Code: wire.CodeDeadlineExceeded, Message: "job deadline passed before it started"})
		return nil
	}
	run.prefill = a.cfg.Pool == subjects.PoolPrefill
	run.pdDecode = a.cfg.Pool == subjects.PoolDecode && job.GetPd() != nil
	// A released decode job belongs to a request cancelled while its
	// prefill ran: it is handled as cancelled, whoever heard the cancel.
	run.release = run.pdDecode && job.GetRelease()
	run.cancelled = run.release || a.wasCancelled(run.key.request, run.key.attempt)
	if exp := job.GetHandoffExpires(); run.pdDecode && exp != nil && now.After(exp.AsTime()) {
		// The prefill engine no longer holds the KV: the decode would fail
		// or recompute. End the attempt before any token; the broker
		// retries the request.
		a.metrics.jobs.WithLabelValues(JobExpired).Inc()
		_ = msg.Term()
		if !run.cancelled {
			out.fail(&wire.Error{Code: wire.CodeHandoffExpired, Retryable: true,
				Message: fmt.Sprintf("decode job taken %s after its hand-off expired (the prefill engine's KV hold)", now.Sub(exp.AsTime()).Round(time.Millisecond))})
		}
		return nil
	}
	if a.heldBack(msg) || a.avoided(run) {
		return nil
	}
	return run
}

// claim records the job's attempt as running here, and reports whether
// the job goes on. The broker relays one agent per attempt and stops the
// others as they speak, but it cannot tell two runs of one agent apart: a
// second copy here is taken off the queue and never started. A decode leg
// always runs, since it frees its prefill engine's KV: two prefill legs
// of one attempt (an offer that moved as its agent took it, the second
// stopped only after its hand-off) send two decode jobs, and the second
// one here (while the first runs, or after it ended: see dupWindow) takes
// its hand-off in silence, as a released one does, instead of
// interleaving a second stream of the same chunk numbers (batched
// differently) with the first. A released job is silent anyway and holds
// no place.
func (a *Agent) claim(run *jobRun) bool {
	if run.release {
		return true
	}
	a.mu.Lock()
	_, dup := a.running[run.key]
	if !dup {
		a.running[run.key] = time.Time{}
	}
	a.mu.Unlock()
	switch {
	case !dup:
		return true
	case !run.pdDecode:
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		a.log.Debug("second copy of an attempt running or run here dropped", "request", run.key.request, "attempt", run.key.attempt)
		_ = run.msg.Ack()
		return false
	default:
		a.log.Debug("second decode leg of an attempt running or run here: its hand-off is taken in silence", "request", run.key.request, "attempt", run.key.attempt)
		run.release, run.cancelled = true, true
		return true
	}
}

// unclaim ends claim's record: an attempt that reached its engine is
// remembered as run here; a job dropped before (its ack not confirmed)
// may come back here and must run.
func (a *Agent) unclaim(run *jobRun) {
	if run.release {
		return // never claimed, or a second decode leg: not its record
	}
	a.mu.Lock()
	if run.ran {
		a.ranHere(run.key, time.Now())
	} else {
		delete(a.running, run.key)
	}
	a.mu.Unlock()
}

// takeCancelled handles a job whose request was cancelled before it
// started, and reports whether it still runs: a decode leg takes its
// hand-off, in silence, so the prefill engine frees the KV it holds for
// it (its stop aborts it at its first chunk); any other job is termed.
func (a *Agent) takeCancelled(run *jobRun) bool {
	if !run.pdDecode {
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		_ = run.msg.Term()
		return false
	}
	run.out.muted.Store(true)
	return true
}

// accept acks the job and tells the broker it runs here; false if the
// job is dropped. A prefill leg double-acks first: its decode job must
// not go out from two agents. Any other speaks at once: accepted now,
// tokens as the engine makes them, the ack's round trip overlapping the
// engine's work instead of delaying the first token. Should two agents
// ever run one attempt (an ack lost in a NATS failover, the job
// redelivered after AckWait), the broker listens only to the first that
// spoke for it.
func (a *Agent) accept(ctx context.Context, run *jobRun) bool {
	out, id := &run.out, run.key.request
	if run.prefill {
		if err := a.doubleAck(ctx, run.msg); err != nil {
			// Not confirmed: the job may already be with another agent.
			a.log.Warn("job ack failed, dropping it", "request", id, "err", err)
			return false
		}
		return true
	}
	run.accepted = wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED, PrefillAgent: run.job.GetPd().GetPrefillAgent()}
	if err := out.send(&run.accepted); err != nil {
		a.log.Warn("accepted chunk not sent", "request", id, "err", err)
	}
	// A plain ack: nothing waits for its confirmation, so the server's
	// reply would only cost a message and a goroutine per job. It leaves
	// with the accepted chunk, in the outbox's next flush.
	if err := a.out.ack(run.msg); err != nil {
		a.log.Warn("job ack not sent", "request", id, "err", err)
	}
	// Until the first token the broker hears from this attempt only
	// through keep-alives: a long prefill, a busy engine, a decode waiting
	// for its KV.
	out.keepalive(ctx, a.cfg.Keepalive)
	return true
}

// stopper returns how the job is stopped: with cause, or for the broker's
// cancel (errCancelled) in the PD hand-off's own way (see stopPD).
func (a *Agent) stopper(run *jobRun, cancel context.CancelCauseFunc) context.CancelCauseFunc {
	return func(cause error) {
		if cause != errCancelled {
			cancel(cause)
			return
		}
		run.out.muted.Store(true) // a cancelled attempt sends nothing more
		a.stopPD(run, cancel)
	}
}

// stopPD stops a cancelled job at its PD hand-off: a decode leg at its KV
// (it still takes the hand-off, so the prefill engine frees the KV); a
// prefill leg that handed off runs on for the decode that reads its KV
// (SGLang), or is done (vLLM). A vLLM leg not yet handed off runs on to
// its answer too: an engine that finished the prefill holds the KV
// whatever the agent does next (aborting a finished request frees
// nothing, vllm #50425), and the agent cannot tell a leg that is still
// computing from one whose answer is on the wire; its decode job goes out
// marked release, and the decode agent frees the KV by taking the
// hand-off. Any other job is cancelled.
func (a *Agent) stopPD(run *jobRun, cancel context.CancelCauseFunc) {
	switch {
	case run.pdDecode:
		run.out.cancelAtKV(cancel)
	case run.prefill && (!run.pf.cancel() || a.cfg.PDProtocol == "vllm"):
	default:
		cancel(errCancelled)
	}
}

// hold makes the job reachable by its cancel and by the drain timeout, by
// request and attempt: a stream migrated to this same agent starts its
// new attempt while the old one may still be ending, and each must stay
// reachable by its own cancel. A cancel that came after admit's check but
// before this found no job to stop; it is on record, so it is honoured
// here.
func (a *Agent) hold(run *jobRun, stop context.CancelCauseFunc) {
	id, attempt := run.key.request, run.key.attempt
	a.mu.Lock()
	a.jobs[id] = append(a.jobs[id], heldJob{attempt: attempt, cancel: stop, out: &run.out})
	mark, cancelledNow := a.cancelled[id]
	drainExpired := a.drainExpired
	a.mu.Unlock()
	switch {
	case run.release, cancelledNow && attempt <= mark.upTo:
		stop(errCancelled)
	case drainExpired:
		stop(errDrainTimeout)
	}
	a.active.Add(1)
}

// unhold ends hold: the job leaves the held ones, and its stream's last
// chunk is kept a while for a resend after a reconnect.
func (a *Agent) unhold(run *jobRun) {
	a.active.Add(-1)
	id, out := run.key.request, &run.out
	a.mu.Lock()
	defer a.mu.Unlock()
	// Its own entry only: a silent second decode leg of the attempt may
	// end before the one that speaks.
	held := slices.DeleteFunc(a.jobs[id], func(h heldJob) bool { return h.out == out })
	if len(held) == 0 {
		delete(a.jobs, id)
	} else {
		a.jobs[id] = held
	}
	now := time.Now()
	i := 0
	for i < len(a.ended) && now.Sub(a.ended[i].at) >= resendWindow {
		i++
	}
	a.ended = a.ended[i:]
	if last := out.lastSent(); last != nil {
		a.ended = append(a.ended, endedStream{at: now, subject: run.job.GetReplySubject(), last: last})
	}
}

// callEngine runs the job on the engine: an embedding's one answer, a
// prefill leg and its hand-off, or a stream; then reports its outcome.
func (a *Agent) callEngine(ctx context.Context, run *jobRun) {
	job, out := &run.job, &run.out
	if job.GetApi() == wire.API_API_EMBEDDINGS {
		a.embed(ctx, job, out) // one JSON answer, relayed as is
		return
	}
	// A PD leg's body is built by the PD adapter from the job's, in one
	// pass with its hand-off fields; any other job streams from its engine.
	body := job.GetBody()
	if !run.prefill && job.GetPd() == nil {
		var err error
		if body, err = oaiformat.StreamingBody(body); err != nil {
			out.fail(&wire.Error{Code: wire.CodeBadRequest, Message: "job body: " + err.Error()})
			return
		}
	}
	req := &run.req
	*req = Request{RequestID: run.key.request, API: job.GetApi(), Body: body, Job: job}
	if a.cfg.Pool != subjects.PoolDecode {
		// In a goroutine of its own, beside the engine call: nothing on
		// the job's path waits for it (a prompt's engine blocks are
		// translated whichever of the events and the tokens comes first).
		a.learnPrompt(job)
	}
	if run.prefill {
		a.prefill(ctx, req, out, &run.pf)
		return
	}
	out.called = time.Now()
	ectx, ecancel := context.WithCancelCause(ctx)
	stop := a.watchProgress(out, ecancel)
	err := stalledError(ectx, a.engine.Stream(ectx, req, out.emit))
	stop()
	ecancel(nil)
	a.metrics.duration.Observe(time.Since(out.called).Seconds())
	a.finish(ctx, out, run.key.request, err)
}

// finish reports how a job's engine call ended: cancelled (nothing is
// reported), its final, drained, expired, or one clear error. Chat and
// embeddings both end here, so an engine's failure reads alike whichever
// API the job was: an error that is not a wire.Error, which no adapter
// classified, is CodeEngine (the engine failed), never CodeEngineDown,
// which only an adapter that saw the engine unreachable can say.
func (a *Agent) finish(ctx context.Context, out *stream, id string, err error) {
	switch cause := context.Cause(ctx); {
	case cause == errCancelled || out.muted.Load():
		// Stopped by its cancel, or (a PD decode leg) ran on silently to
		// take its hand-off: nothing is reported.
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		a.log.Debug("job cancelled", "request", id, "tookKV", out.tookKV)
	case err == nil:
		a.metrics.jobs.WithLabelValues(JobOK).Inc()
		out.finish()
	case cause == errDrainTimeout:
		a.metrics.jobs.WithLabelValues(JobDrained).Inc()
		a.log.Info("job ended by the drain timeout", "request", id, "tokens", out.tokens)
		out.fail(drainedError(a.cfg.ID))
	case cause == errPreempted:
		a.metrics.jobs.WithLabelValues(JobPreempted).Inc()
		a.log.Debug("batch job preempted", "request", id, "tokens", out.tokens)
		out.fail(preemptedError(a.cfg.ID))
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		a.metrics.jobs.WithLabelValues(JobExpired).Inc()
		out.fail(&wire.Error{Code: wire.CodeDeadlineExceeded, Message: "request deadline exceeded in the engine"})
	default:
		a.metrics.jobs.WithLabelValues(errorOutcome(err)).Inc()
		var we *wire.Error
		if !errors.As(err, &we) {
			we = &wire.Error{Code: wire.CodeEngine, Message: err.Error()}
		}
		// Safe to run again elsewhere only if the client saw nothing and the
		// engine did not judge the request itself bad.
		we.Retryable = out.tokens == 0 && wire.Repeatable(we.Code)
		a.log.Warn("engine request failed", "request", id, "err", err)
		a.engineRefused(we) // before the error goes out: the retry must not come back here
		if wire.Repeatable(we.Code) {
			// Retried or migrated: elsewhere, preferably.
			a.avoid.failedHere(id, out.job.GetAttempt(), time.Now())
		}
		out.fail(we)
	}
}

// prefillState orders a prefill job's hand-off against its cancel: before
// the hand-off a cancel aborts the leg; from the hand-off on the decode
// side owns the KV, and a cancel leaves the leg alone.
type prefillState struct {
	mu        sync.Mutex
	handedOff bool // the hand-off began: the decode job is being published
	cancelled bool
	published bool // the decode job is in its queue
}

// cancel records a cancel and reports whether it should abort the leg.
func (p *prefillState) cancel() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancelled = true
	return !p.handedOff
}

func (p *prefillState) isCancelled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cancelled
}

// handOff marks the hand-off begun and reports whether a cancel came
// first.
func (p *prefillState) handOff() (cancelled bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.handedOff = true
	return p.cancelled
}

// prefill runs the prefill leg of a PD job and publishes its decode job.
// It reports on the reply subject only in the prefill stage: accepted,
// keep-alives while the leg runs, and an error if the leg fails; the decode
// agent owns the token stream.
func (a *Agent) prefill(ctx context.Context, req *Request, out *stream, ps *prefillState) {
	out.stage = wire.Chunk_STAGE_PREFILL
	out.send(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
	out.keepalive(ctx, a.cfg.Keepalive)
	pf, ok := a.engine.(Prefiller)
	if !ok {
		out.fail(&wire.Error{Code: wire.CodeInternal, Message: "agent " + a.cfg.ID + " has no prefill-capable engine"})
		return
	}
	if ps.isCancelled() {
		// Cancelled between its pull and here: the engine has nothing yet.
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		return
	}
	calls := 0
	handoff := func(h *wire.PDHandoff) error {
		if calls++; calls > 1 {
			return errors.New("agent: handoff called twice")
		}
		cancelled := ps.handOff()
		if cancelled && a.cfg.PDProtocol == "sglang" {
			// Cancelled before SGLang's hand-off, which comes before its
			// leg: no KV exists yet, so nothing needs a decode.
			return errCancelled
		}
		// vLLM hands off once its leg is done and the engine holds the
		// KV: the decode job goes out even for a cancelled request, so a
		// decode agent reads (and frees) the KV instead of leaving it held
		// until the engine's lease ends.
		a.lastHandoff.Store(time.Now().UnixNano())
		err := a.publishDecode(context.WithoutCancel(ctx), req.Job, h, cancelled)
		if err == nil {
			ps.mu.Lock()
			ps.published = true
			ps.mu.Unlock()
			// Tell the broker the hand-off is queued: until a decode agent
			// takes it nobody speaks, and the broker bounds that wait by
			// the KV hold instead of its stall timer.
			out.send(&wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Raw: req.PrefillUsage})
		}
		return err
	}
	err := pf.Prefill(ctx, req, handoff)
	ps.mu.Lock()
	handedOff, published := ps.handedOff, ps.published
	ps.mu.Unlock()
	if err == nil && !handedOff {
		err = errors.New("prefill finished without a hand-off")
	}
	switch {
	case out.muted.Load() || context.Cause(ctx) == errCancelled:
		a.metrics.jobs.WithLabelValues(JobCancelled).Inc()
		a.log.Debug("prefill cancelled", "request", req.RequestID, "handedOff", handedOff)
	case err == nil:
		a.metrics.jobs.WithLabelValues(JobHandedOff).Inc()
		out.ended = true
	case context.Cause(ctx) == errDrainTimeout && !published:
		a.metrics.jobs.WithLabelValues(JobDrained).Inc()
		out.fail(drainedError(a.cfg.ID))
	default:
		a.metrics.jobs.WithLabelValues(errorOutcome(err)).Inc()
		var we *wire.Error
		if !errors.As(err, &we) {
			we = &wire.Error{Code: wire.CodeEngine, Message: "prefill leg: " + err.Error()}
		}
		// Before its decode job is out, the client has seen nothing.
		we.Retryable = !published && wire.Repeatable(we.Code)
		a.log.Warn("prefill leg failed", "request", req.RequestID, "err", err)
		a.engineRefused(we)
		out.fail(we)
	}
}

// Bounds of one try to publish a decode job and of the wait between two.
const (
	publishTry        = time.Second
	publishBackoffMin = 25 * time.Millisecond
	publishBackoffMax = time.Second
)

// publishDecode sends the decode leg of job to the decode queue of the
// agent's pairing. A "not now" failure (no responders while a stream
// leader is elected, a timeout, NATS reconnecting) is tried again with
// backoff for as long as the job's deadline and the hand-off's KV hold
// allow; a full queue ends the attempt with a retryable queue_full error.
//
// A release job (its request cancelled) only has a decode agent take the
// hand-off, so the prefill engine frees the KV.
func (a *Agent) publishDecode(ctx context.Context, job *wire.Job, h *wire.PDHandoff, release bool) error {
	dj := proto.Clone(job).(*wire.Job)
	dj.Release = release
	h = proto.Clone(h).(*wire.PDHandoff)
	h.PrefillAgent = a.cfg.ID
	if h.Protocol == "" {
		h.Protocol = a.cfg.PDProtocol
	}
	dj.Pd = h
	dj.PdPair = a.pair
	expires := time.Now().Add(a.cfg.KVHold)
	dj.HandoffExpires = timestamppb.New(expires)
	data, err := proto.Marshal(dj)
	if err != nil {
		return err
	}
	until := expires
	if dl := job.GetDeadline(); dl != nil && dl.AsTime().Before(until) {
		until = dl.AsTime()
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	// One id per attempt's decode job: a try whose answer was lost but
	// whose message was stored is not stored twice.
	// The agent's id is part of it: should two prefill agents run one
	// attempt (see onCancel), the second one's decode job, a release one
	// if it was stopped, must not be taken for the first one's.
	msgID := fmt.Sprintf("%s.%d.decode.%s", job.GetRequestId(), job.GetAttempt(), a.cfg.ID)
	decodeSubj := a.decodeSubject(job)
	_, _, err = natsx.Publish(ctx, a.js, decodeSubj, data, msgID, natsx.Retry{
		Try: publishTry, MinBackoff: publishBackoffMin, MaxBackoff: publishBackoffMax,
		Retrying: func(err error, backoff time.Duration) {
			a.metrics.publishRetries.Inc()
			a.log.Debug("decode job not published yet, retrying", "request", job.GetRequestId(), "err", err, "backoff", backoff)
		},
	})
	switch {
	case err == nil:
		return nil
	case natsx.QueueFull(err):
		return &wire.Error{Code: wire.CodeQueueFull, Retryable: true,
			Message: "the decode queue " + decodeSubj + " is full: " + err.Error()}
	case ctx.Err() != nil:
		return &wire.Error{Code: wire.CodeEngineDown, Message: "publishing the decode job until its deadline or KV hold: " + err.Error()}
	default:
		return &wire.Error{Code: wire.CodeEngineDown, Message: "publishing the decode job: " + err.Error()}
	}
}

func (a *Agent) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	a.publishHeartbeat(ctx)
	for {
		select {
		case <-ctx.Done():
			a.publishGoodbye()
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
	a.sendHeartbeat(a.Heartbeat(), "heartbeat publish failed")
}

// sendHeartbeat publishes hb, logging failed as the message should the
// publish fail.
func (a *Agent) sendHeartbeat(hb *wire.Heartbeat, failed string) {
	data, err := wire.MarshalHeartbeat(hb)
	if err != nil {
		a.log.Error("heartbeat encode", "err", err)
		return
	}
	if err := a.nc.Publish(a.hbSubj, data); err != nil {
		a.metrics.hbErrors.Inc()
		a.log.Warn(failed, "err", err)
	}
}

// Heartbeat returns the heartbeat the agent would publish now.
func (a *Agent) Heartbeat() *wire.Heartbeat {
	st := a.state.Load()
	hb := &wire.Heartbeat{
		AgentId:     a.cfg.ID,
		Model:       a.cfg.Model,
		Pool:        a.cfg.Pool,
		Engine:      a.cfg.Engine,
		Transport:   a.cfg.Transport,
		State:       st.state,
		StateReason: st.reason,

		Slots:  uint32(a.cfg.Slots),
		Active: uint32(max(0, a.Active())),
		// Counted as free by interactive dispatch: see batchclass.go.
		BatchActive: uint32(max(0, a.batch.held.Load())),
		Interval:    durationpb.New(a.cfg.Heartbeat),
		Seq:         a.hbSeq.Add(1),
		Version:     a.cfg.Version,
		SentAt:      timestamppb.Now(),
	}
	if a.cfg.Pool != subjects.PoolRegular {
		hb.PdProtocol = a.cfg.PDProtocol
		hb.PdLabels = a.cfg.PDLabels
	}
	if a.cfg.Pool == subjects.PoolPrefill && a.cfg.BootstrapPort != 0 {
		hb.BootstrapHost = a.cfg.BootstrapHost
		hb.BootstrapPort = uint32(a.cfg.BootstrapPort)
	}
	if st.state == wire.StateReady {
		hb.PullLimit = uint32(a.pullLimit(time.Now()))
	}
	if rs := a.readySince.Load(); rs != 0 {
		hb.ReadySince = timestamppb.New(time.Unix(0, rs))
	}
	if l := a.load.Load(); l != nil {
		hb.EngineRunning = proto.Uint32(uint32(l.Running))
		hb.EngineWaiting = proto.Uint32(uint32(l.Waiting))
		hb.KvCacheUsage = proto.Float64(l.KVCacheUsage)
		if l.HasPrefix {
			hb.PrefixCacheQueries, hb.PrefixCacheHits = proto.Float64(l.PrefixQueries), proto.Float64(l.PrefixHits)
		}
	}
	hb.KvEvents = a.cfg.KVEvents != ""
	return hb
}
