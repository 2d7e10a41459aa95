package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// Work classes. Beside its interactive queues an agent pulls its pool's
// batch queue (subjects.BatchJobs), under one rule: interactive work
// first.
//
//   - A batch job is pulled only while the interactive queue is empty: the
//     agent's interactive pull has been waiting, unfilled, for
//     Config.BatchIdleGate (JetStream hands a waiting pull every job it has at
//     once, so a pull that waits found the queue empty).
//   - Batch jobs never take the last Config.BatchReserve slots, nor more
//     than Config.BatchMax of them, so a small burst starts at once.
//   - An interactive job that finds no free slot preempts a batch job the
//     broker marked preemptible (Job.preemptible), the newest first: its
//     engine request is cancelled and it ends with a retryable
//     wire.CodePreempted error, which the broker repairs outside its
//     retry and migration limits (from the start before its first token,
//     continuing its text after it). The interactive job takes the slot
//     at once. So the interactive pull counts preemptible batch jobs as
//     free room, and so does the agent's heartbeat (batch_active).
//
// Agents of the prefill and decode pools apply the first two rules only:
// a PD leg is not preempted (its hand-off's KV is the other leg's).

// DefaultBatchIdleGate is how long the interactive pull must have waited
// unfilled before a batch job may start (Config.BatchIdleGate): long
// enough for JetStream to have handed it a job the queue held.
const DefaultBatchIdleGate = 20 * time.Millisecond

// batchPullWait bounds a batch pull: a batch job delivered after the
// interactive queue filled again is handed back, so pulls stay short.
const batchPullWait = time.Second

// errPreempted is the cause of a batch job stopped for interactive work.
var errPreempted = errors.New("preempted for interactive work")

// preemptedError ends a preempted job: retryable, whatever it sent.
func preemptedError(agentID string) *wire.Error {
	return &wire.Error{Code: wire.CodePreempted, Retryable: true,
		Message: "agent " + agentID + " gave the batch job's slot to interactive work"}
}

// batchSched is an agent's batch-class state.
type batchSched struct {
	held atomic.Int32 // batch jobs held (pulled and not yet ended)
	// Since when the interactive queue looks empty (unix ns): the start
	// of an interactive pull, or its last job, while the pulls are not
	// filled; 0 once a pull got every job it asked for (the queue may hold
	// more), until the next pull.
	pullAt atomic.Int64

	mu      sync.Mutex
	running []*batchRun // preemptible jobs in the order they started
	// preempted counts the jobs preempted since the agent started.
	preempted atomic.Uint64
}

type batchRun struct {
	stop context.CancelCauseFunc
}

// interactivePulling notes an interactive pull asked at now: a pull that
// follows an unfilled one keeps its time.
func (s *batchSched) interactivePulling(now time.Time) { s.pullAt.CompareAndSwap(0, now.UnixNano()) }

// interactiveGot notes a job the interactive pull delivered at now; filled:
// the pull got every job it asked for, so the queue may hold more.
func (s *batchSched) interactiveGot(now time.Time, filled bool) {
	if filled {
		s.pullAt.Store(0)
	} else {
		s.pullAt.Store(now.UnixNano())
	}
}

// interactiveIdle reports whether the interactive queue is empty as far as
// the agent can tell: its pull has waited, unfilled, gate.
func (s *batchSched) interactiveIdle(now time.Time, gate time.Duration) bool {
	at := s.pullAt.Load()
	return at != 0 && now.Sub(time.Unix(0, at)) >= gate
}

// preemptible returns the batch jobs an interactive one may preempt.
func (s *batchSched) preemptible() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

func (s *batchSched) add(r *batchRun) {
	s.mu.Lock()
	s.running = append(s.running, r)
	s.mu.Unlock()
}

func (s *batchSched) remove(r *batchRun) {
	s.mu.Lock()
	s.running = slices.DeleteFunc(s.running, func(x *batchRun) bool { return x == r })
	s.mu.Unlock()
}

// preemptOne stops the newest preemptible batch job, and reports whether
// there was one.
func (s *batchSched) preemptOne() bool {
	s.mu.Lock()
	n := len(s.running)
	if n == 0 {
		s.mu.Unlock()
		return false
	}
	r := s.running[n-1]
	s.running = s.running[:n-1]
	s.mu.Unlock()
	s.preempted.Add(1)
	r.stop(errPreempted)
	return true
}

// batchLimit is how many batch jobs the agent may hold now, limit being
// its pull limit: what the reserve leaves, at most BatchMax.
func (a *Agent) batchLimit(limit int) int {
	n := limit - a.cfg.BatchReserve
	if a.cfg.BatchMax > 0 {
		n = min(n, a.cfg.BatchMax)
	}
	return max(n, 0)
}

// batchRoom returns how many batch jobs the next batch pull may ask for.
func (a *Agent) batchRoom(now time.Time) int {
	if !a.batch.interactiveIdle(now, a.cfg.BatchIdleGate) {
		return 0
	}
	limit := a.pullLimit(now)
	n := a.batchLimit(limit) - int(a.batch.held.Load())
	// Batch jobs never take the reserve's slots, however interactive
	// work holds the others.
	return min(n, limit-a.cfg.BatchReserve-a.slots.held())
}

// preempts reports whether the agent preempts batch jobs for interactive
// ones: regular-pool agents, unless turned off.
func (a *Agent) preempts() bool {
	return !a.cfg.NoBatchPreempt && a.cfg.Pool == subjects.PoolRegular
}

// interactiveRoom is the room an interactive pull may ask for: free slots,
// plus the batch jobs it would preempt.
func (a *Agent) interactiveRoom(limit int) int {
	n := limit - a.slots.held()
	if a.preempts() {
		n += a.batch.preemptible()
	}
	return n
}

// takeInteractive takes a slot for an interactive job, preempting a batch
// job when none is free; it reports whether the job may start.
func (a *Agent) takeInteractive(limit int) bool {
	if a.slots.acquire(limit) {
		return true
	}
	if !a.preempts() || !a.batch.preemptOne() {
		return false
	}
	// The preempted job gives its slot back as it ends, within
	// milliseconds; the interactive job does not wait for that.
	a.slots.n.Add(1)
	return true
}

// holdBatch makes a running batch job preemptible, if the broker allows
// it, until the returned func is called.
func (a *Agent) holdBatch(run *jobRun, stop context.CancelCauseFunc) func() {
	if !run.job.GetBatch() || !run.job.GetPreemptible() || !a.preempts() {
		return func() {}
	}
	r := &batchRun{stop: stop}
	a.batch.add(r)
	return func() { a.batch.remove(r) }
}

// batchQueue returns the agent's batch consumer name and subject.
func (a *Agent) batchQueue() (name, filter string, err error) {
	if name, err = subjects.BatchConsumerName(a.cfg.Model, a.cfg.Pool, a.pair); err != nil {
		return "", "", err
	}
	filter, err = a.subj.BatchJobs(a.cfg.Model, a.cfg.Pool, a.pair)
	return name, filter, err
}

func (a *Agent) batchConsumer(ctx context.Context) (jetstream.Consumer, error) {
	name, filter, err := a.batchQueue()
	if err != nil {
		return nil, err
	}
	return a.bindConsumer(ctx, a.cfg.Stream, name, filter, 0)
}

// decodeSubject is where a prefill agent hands job off: its decode pool's
// queue of job's class.
func (a *Agent) decodeSubject(job *wire.Job) string {
	if job.GetBatch() {
		return a.decodeBatchSubj
	}
	return a.decodeSubj
}
