package broker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/natsx"
	"github.com/switchyard-ai/switchyard/subjects"
)

// The directed queues (affinity offers, subjects.Directed) live in a
// stream of their own beside the jobs stream, with one replica whatever
// the jobs stream has: a work-queue stream gives every consumer its own
// replicas, and each agent has a consumer on its directed queue, so on a
// replicated jobs stream every agent would cost the cluster a raft group
// (docs/performance.md, "A fleet on a cluster"). One replica means a
// directed job is lost with its server: an offer is only a preference, so
// while that stream is unusable (its server lost, a publish refused) the
// broker sends every job to the shared queue at once, and moves an offer
// it cannot delete there as it moves one not taken in time. The broker's
// readiness does not depend on it.

// directedStream is the broker's view of the directed stream.
type directedStream struct {
	// st is the stream once created; deletes of offers go through it
	// even while it is not usable for new ones.
	st atomic.Pointer[jetstream.Stream]
	// usable: offers may be published now.
	usable atomic.Bool
	mu     sync.Mutex
	down   bool // a problem was logged and no recovery since
}

// errNoDirected is the error of an offer whose stream was never created.
var errNoDirected = errors.New("directed stream not created")

func (b *Broker) directedName() string { return subjects.DirectedStream(b.cfg.Stream) }

// ensureDirected creates or updates the directed stream: the jobs
// stream's limits, one replica, memory storage unless configured or
// refused (a server without JetStream memory), or the storage an
// existing one was created with.
func (b *Broker) ensureDirected(ctx context.Context) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*b.publishTimeout)
	defer cancel()
	maxAge := b.cfg.RequestTimeout + b.cfg.Affinity.Wait
	cfg := jetstream.StreamConfig{
		Name:                 b.directedName(),
		Description:          "Switchyard affinity offers, one subject per agent",
		Subjects:             []string{b.subj.DirectedAll()},
		Retention:            jetstream.WorkQueuePolicy,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    int64(b.cfg.QueueMax),
		MaxAge:               maxAge,
		Duplicates:           min(b.dupWindow(), maxAge),
		Storage:              jetstream.MemoryStorage,
		Replicas:             1,
	}
	if b.cfg.DirectedFileStorage {
		cfg.Storage = jetstream.FileStorage
	}
	st, err := b.js.CreateOrUpdateStream(ctx, cfg)
	var apiErr *jetstream.APIError
	if err != nil && errors.As(err, &apiErr) {
		if found, serr := b.js.Stream(ctx, cfg.Name); serr == nil && found.CachedInfo().Config.Storage != cfg.Storage {
			cfg.Storage = found.CachedInfo().Config.Storage
		} else if cfg.Storage == jetstream.MemoryStorage {
			b.log.Info("directed stream refused in memory, creating it on disk", "stream", cfg.Name, "err", describeJSError(err))
			cfg.Storage = jetstream.FileStorage
		}
		st, err = b.js.CreateOrUpdateStream(ctx, cfg)
	}
	if err != nil {
		return nil, b.explainJS(err)
	}
	b.directed.st.Store(&st)
	return st, nil
}

// startDirected creates the directed stream beside the jobs stream
// (EnsureStream), once: its keeper (keepDirected) checks it from then on.
// A failure is logged and leaves affinity to the shared queue; it does
// not fail EnsureStream.
func (b *Broker) startDirected(ctx context.Context) {
	if b.directed.st.Load() != nil {
		return
	}
	if st, err := b.ensureDirected(ctx); err != nil {
		b.directedFailed(err)
	} else {
		b.directedOK(st.CachedInfo())
	}
}

// keepDirected creates the directed stream, then checks it as keepStream
// checks the jobs stream: offers go to it only while it has a leader, and
// it is created again when it is gone.
func (b *Broker) keepDirected(ctx context.Context) {
	t := time.NewTicker(streamCheckInterval)
	defer t.Stop()
	created := b.directed.st.Load() != nil
	for {
		if b.nc.IsConnected() {
			created = b.checkDirected(ctx, created)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkDirected checks the directed stream once, creating it if it was
// not yet or is gone, and reports whether it exists.
func (b *Broker) checkDirected(ctx context.Context, created bool) bool {
	if !created {
		st, err := b.ensureDirected(ctx)
		if err != nil {
			b.directedFailed(err)
			return false
		}
		b.directedOK(st.CachedInfo())
		return true
	}
	ictx, cancel := context.WithTimeout(ctx, b.publishTimeout)
	defer cancel()
	st, err := b.js.Stream(ictx, b.directedName())
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		b.log.Warn("directed stream missing, recreating it", "stream", b.directedName())
		return b.checkDirected(ctx, false)
	case err != nil:
		if ctx.Err() == nil {
			b.directedFailed(err)
		}
		return true
	}
	b.directedOK(st.CachedInfo())
	return true
}

// directedOK records a check that found the stream: usable if it has a
// leader.
func (b *Broker) directedOK(info *jetstream.StreamInfo) {
	if info != nil && info.Cluster != nil && info.Cluster.Leader == "" {
		b.directedFailed(errors.New("the stream has no leader: its server is lost"))
		return
	}
	d := &b.directed
	d.mu.Lock()
	was := d.down
	d.down = false
	d.usable.Store(true)
	d.mu.Unlock()
	if was {
		b.log.Info("directed stream usable again: affinity offers resume", "stream", b.directedName())
	}
}

// directedFailed makes the stream unusable for offers until a check finds
// it again, and logs the first failure of a run of them.
func (b *Broker) directedFailed(err error) {
	d := &b.directed
	d.mu.Lock()
	was := d.down
	d.down = true
	d.usable.Store(false)
	d.mu.Unlock()
	if !was {
		b.log.Warn("directed stream unusable: affinity offers go to the shared queue until it is back", "stream", b.directedName(), "err", describeJSError(err))
	}
}

// publishFirst publishes the current attempt's job: an offer (c.aff.agent
// set by prefer) once on its directed queue, bounded by the affinity wait,
// and the job on the shared queue at once if that fails; anything else as
// publish does.
func (c *Call) publishFirst(ctx context.Context, subject string, data []byte, attempt uint32) (uint64, error) {
	a := &c.aff
	if a.agent == "" {
		return c.publish(ctx, subject, data, attempt)
	}
	b := c.b
	pctx, cancel := context.WithTimeout(ctx, min(b.publishTimeout, b.cfg.Affinity.Wait))
	ack, err := b.js.Publish(pctx, subject, data, jetstream.WithMsgID(jobMsgID(c.ID, attempt)), jetstream.WithExpectStream(b.directedName()))
	cancel()
	if err == nil {
		a.directed = true
		return ack.Sequence, nil
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if !natsx.QueueFull(err) {
		b.directedFailed(err)
	}
	a.agent = ""
	a.pool.count(resUnusable)
	return c.publish(ctx, a.shared, data, attempt)
}

// jobStream returns the stream holding the current attempt's job.
func (c *Call) jobStream() *jetstream.Stream {
	if c.aff.directed {
		return c.b.directed.st.Load()
	}
	return c.b.stream.Load()
}

// offerTaken reports whether the offer at seq, which st refused to delete
// (gone from it), was taken by its agent: not if the stream no longer
// holds the history of that offer, because it was created again after
// the offer (deleted, or its server lost and back without its memory),
// nor when it does not answer.
func (b *Broker) offerTaken(ctx context.Context, st jetstream.Stream, seq uint64, offered time.Time) bool {
	info, err := st.Info(ctx)
	if err != nil {
		return false
	}
	return info.State.LastSeq >= seq && !info.Created.After(offered)
}
