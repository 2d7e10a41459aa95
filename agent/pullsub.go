package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jobMessage is the part of a jetstream.Msg a job's handling uses.
type jobMessage interface {
	Data() []byte
	Ack() error
	DoubleAck(context.Context) error
	Nak() error
	NakWithDelay(time.Duration) error
	Term() error
}

var _ jobMessage = jetstream.Msg(nil)

// consumerRef is the pool's consumer as the agent's slots share it. When a
// pull shows the consumer gone (a NATS server restarted on an empty store,
// a stream recreated, a consumer deleted by hand), the first slot to notice
// binds it again and the others wait for that rather than each asking.
type consumerRef struct {
	mu   sync.Mutex // held while the consumer is being bound again
	cons jetstream.Consumer
	gen  int
	// bind binds the consumer again; nil: the pool's shared consumer.
	bind func(context.Context) (jetstream.Consumer, error)
	// yield delays a pull after a slot freed on a full agent, so that
	// another queue's pull claims it first (see pullAll).
	yield time.Duration
	// batch: the pool's batch queue, pulled only with room interactive
	// work leaves (see batchclass.go). signal: the shared interactive
	// queue, whose pulls tell the batch pull when it is empty.
	batch, signal bool
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
	bind := r.bind
	if bind == nil {
		bind = a.consumer
	}
	cons, err := bind(ctx)
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

// workerIdle is how long a job worker waits for another job before it
// ends.
const workerIdle = 10 * time.Second

// pull is the agent's pull loop for one queue: it holds one token per
// free slot, asks the queue's consumer for exactly that many jobs
// (Consumer.Fetch with the pull wait as its expiry) and runs each job as
// it arrives on a worker goroutine, which returns its token when the job
// ends. So the agent never holds more jobs than its pull limit (its slots,
// or less while it ramps up after becoming ready), a full agent does not
// ask, and the server keeps one waiting pull request per loop, not one
// per idle slot. Pull failures back off (a pull that fails at once must
// not spin) and a consumer found gone is bound again.
//
// The agent runs one such loop per queue it pulls (the shared one and its
// directed one, see pullAll); they share one count of jobs held, so two
// pulls may together be offered more than the room left: a job beyond the
// limit is handed straight back (Nak) and never started.
func (a *Agent) pull(ctx context.Context, ref *consumerRef, jobs *sync.WaitGroup) {
	l := &pullLoop{a: a, ctx: ctx, ref: ref, jobs: jobs,
		work: make(chan jobMessage), quit: make(chan struct{}),
		// A job's context has the loop's values, not its cancel: a
		// stopping agent drains its jobs.
		base: context.WithoutCancel(ctx)}
	defer close(l.quit)
	for ctx.Err() == nil {
		if !a.waitServing(ctx) {
			return
		}
		n := l.room()
		if n <= 0 {
			continue
		}
		cons, gen := ref.get()
		wait := a.cfg.PullWait
		if ref.batch {
			wait = min(wait, batchPullWait)
		}
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(wait))
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("pull failed", "err", err)
				l.pause()
			}
			continue
		}
		if ref.signal {
			a.batch.interactivePulling(time.Now())
		}
		// A pull ends when it has n jobs or expires; while it has fewer,
		// every job that arrives is delivered to it at once. A draining
		// agent waits the pull out, handing back what still comes.
		got := 0
		for msg := range batch.Messages() {
			if got++; ref.signal {
				a.batch.interactiveGot(time.Now(), got == n)
			}
			l.take(msg)
		}
		switch err := batch.Error(); {
		case err == nil || ctx.Err() != nil:
			l.backoff = 0
		case consumerGone(err):
			ref.renew(ctx, a, gen)
			l.backoff = 0 // bound again: pull again soon
			l.pause()
		default:
			a.log.Debug("pull ended", "err", err)
			l.pause()
		}
	}
}

// pullLoop is one pull loop's state (see pull).
type pullLoop struct {
	a    *Agent
	ctx  context.Context
	base context.Context
	ref  *consumerRef
	jobs *sync.WaitGroup
	// Jobs run on workers that outlive one job: a goroutine per job grew
	// its stack anew for every engine call. A worker waits a while for the
	// next job (work), and every worker ends with the loop (quit).
	work    chan jobMessage
	quit    chan struct{}
	backoff time.Duration
}

// pause waits before the next pull after a failure, longer each time.
func (l *pullLoop) pause() {
	l.backoff = min(max(2*l.backoff, 50*time.Millisecond), pullRetryMax)
	select {
	case <-l.ctx.Done():
	case <-time.After(l.backoff):
	}
}

// room returns how many jobs the next pull may ask for; when the agent is
// full it first waits for a job to end or the ramp to make room, and
// returns 0.
func (l *pullLoop) room() int {
	a := l.a
	now := time.Now()
	freed := a.slots.freed() // before counting: a job ending meanwhile wakes the wait below
	var n int
	if l.ref.batch {
		n = a.batchRoom(now)
	} else {
		n = a.interactiveRoom(a.pullLimit(now))
	}
	if n > 0 {
		return n
	}
	if l.ref.signal {
		// No pull watches the interactive queue while the agent is full:
		// it may fill meanwhile.
		a.batch.interactiveGot(now, true)
	}
	var grow <-chan time.Time
	if every, ok := a.ramping(now); ok {
		t := time.NewTimer(every)
		defer t.Stop()
		grow = t.C
	}
	if l.ref.batch && a.slots.held() < a.pullLimit(now) {
		// Room, but interactive work may want it: look again once the
		// interactive pull had time to show its queue empty.
		t := time.NewTimer(a.cfg.BatchIdleGate)
		defer t.Stop()
		grow = t.C
	}
	select {
	case <-freed:
		if l.ref.yield > 0 {
			time.Sleep(l.ref.yield)
		}
	case <-grow:
	case <-l.ctx.Done():
	}
	return 0
}

// take starts a job the pull delivered, or hands it straight back.
func (l *pullLoop) take(msg jobMessage) {
	a := l.a
	if l.ctx.Err() != nil {
		// Draining: hand the job straight back to the pool.
		_ = msg.Nak()
		return
	}
	if l.ref.batch {
		now := time.Now()
		if !a.batch.interactiveIdle(now, a.cfg.BatchIdleGate) || int(a.batch.held.Load()) >= a.batchLimit(a.pullLimit(now)) ||
			!a.slots.acquire(a.pullLimit(now)-a.cfg.BatchReserve) {
			// Interactive work came meanwhile: the batch job waits a
			// moment in its queue rather than come straight back here.
			_ = msg.NakWithDelay(batchPullWait)
			return
		}
		a.batch.held.Add(1)
	} else if !a.takeInteractive(a.pullLimit(time.Now())) {
		// The other queue's pull filled the room meanwhile.
		_ = msg.Nak()
		return
	}
	l.jobs.Add(1)
	select {
	case l.work <- msg: // an idle worker takes it
	default:
		go l.worker(msg)
	}
}

// worker runs msg, then the jobs handed to it, until it has been idle for
// workerIdle or the loop ends.
func (l *pullLoop) worker(msg jobMessage) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		l.run(msg)
		idle.Reset(workerIdle)
		select {
		case msg = <-l.work:
		case <-idle.C:
			return
		case <-l.quit:
			return
		}
	}
}

func (l *pullLoop) run(msg jobMessage) {
	defer l.jobs.Done()
	defer l.a.slots.release()
	if l.ref.batch {
		defer l.a.batch.held.Add(-1)
	}
	l.a.handle(l.base, msg)
}
