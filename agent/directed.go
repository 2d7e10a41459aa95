package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/subjects"
)

// Directed work (prefix-cache affinity): a broker may offer a job to one
// agent first, on a queue only that agent pulls (subjects.Directed), beside
// the pool's shared queue. The agent pulls both within one limit; a job it
// does not take in time the broker moves to the shared queue. Directed
// queues live in a stream of their own (subjects.DirectedStream), which the
// brokers create with one replica: the consumer each agent has there is
// then no raft group of the cluster. While that stream is missing the
// agent keeps trying to bind its consumer, and the brokers send every job
// to the shared queue.

// directedInactive is how long JetStream keeps an agent's directed
// consumer once nobody pulls it: an agent that died leaves no consumer
// behind for long, and one that was full that long binds it again.
const directedInactive = 5 * time.Minute

// pullAll runs the pull loops of the agent's queues: the shared one and,
// unless turned off, its directed one; it returns when both have stopped.
func (a *Agent) pullAll(ctx context.Context, shared *consumerRef, jobs *sync.WaitGroup) {
	var wg sync.WaitGroup
	defer wg.Wait()
	shared.signal = true
	if !a.cfg.NoBatch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cons, err := a.batchConsumer(ctx)
			if err != nil {
				return // ctx ended
			}
			a.pull(ctx, &consumerRef{cons: cons, bind: a.batchConsumer, batch: true}, jobs)
		}()
	}
	if a.cfg.NoDirected || a.cfg.Pool == subjects.PoolDecode {
		// Decode jobs come from prefill agents, always to the shared
		// queue: the prefix cache pays on the prefill side.
		a.pull(ctx, shared, jobs)
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		cons, err := a.directedConsumer(ctx)
		if err != nil {
			return // ctx ended
		}
		a.pull(ctx, &consumerRef{cons: cons, bind: a.directedConsumer}, jobs)
	}()
	// A full agent's freed slot goes to its directed queue first: a job
	// there was offered to it for the prefix its engine caches, and waits
	// only a short bound before the broker moves it to be prefilled
	// elsewhere; a job of the shared queue loses nothing by going to
	// another agent.
	shared.yield = directedFirst
	a.pull(ctx, shared, jobs)
}

// directedFirst is how long the shared queue's pull waits after a slot
// freed on a full agent, for the directed queue's pull to claim it.
const directedFirst = 2 * time.Millisecond

// directedQueue returns the agent's directed consumer name and subject.
func (a *Agent) directedQueue() (name, filter string, err error) {
	if name, err = subjects.DirectedConsumerName(a.cfg.Model, a.cfg.Pool, a.pair, a.cfg.ID); err != nil {
		return "", "", err
	}
	filter, err = a.subj.Directed(a.cfg.Model, a.cfg.Pool, a.pair, a.cfg.ID)
	return name, filter, err
}

func (a *Agent) directedConsumer(ctx context.Context) (jetstream.Consumer, error) {
	name, filter, err := a.directedQueue()
	if err != nil {
		return nil, err
	}
	return a.bindConsumer(ctx, subjects.DirectedStream(a.cfg.Stream), name, filter, directedInactive)
}

// slotCount is the number of jobs the agent holds, shared by its pull
// loops: a job takes a slot only if one is free under the limit, and a
// slot freed wakes every loop waiting for room.
type slotCount struct {
	n    atomic.Int32
	mu   sync.Mutex
	wake chan struct{} // closed and replaced at each release
}

func (s *slotCount) held() int { return int(s.n.Load()) }

// acquire takes a slot if fewer than limit are held.
func (s *slotCount) acquire(limit int) bool {
	for {
		cur := s.n.Load()
		if int(cur) >= limit {
			return false
		}
		if s.n.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// freed returns a channel closed at the next release.
func (s *slotCount) freed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wake == nil {
		s.wake = make(chan struct{})
	}
	return s.wake
}

func (s *slotCount) release() {
	s.n.Add(-1)
	s.mu.Lock()
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
	s.mu.Unlock()
}
