package agent

import (
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/wire"
)

// outbox gathers the chunks of every attempt the agent runs into one NATS
// message per broker: a stream frames its chunk into its broker's pending
// message and wakes the outbox's goroutine, which publishes whatever is
// pending when it gets to run. A quiet agent therefore sends each chunk at
// once (one goroutine hand-off later), and a busy one sends the chunks of
// many requests that became ready while it published the last batch in one
// message: one server parse and route, one read and one wake-up of the
// broker's reply subscription per batch instead of per chunk.
//
// A busy agent may also linger: when its last message left less than
// linger ago, the next leaves linger after it, gathering what comes
// meanwhile, unless a chunk that may not wait is pending (an attempt's
// first token, its end: see put), or sooner when a pending chunk may
// wait less (a token of a stream whose tokens come less than two lingers
// apart waits at most half their interval, so it leaves before its
// stream's next). So no chunk waits more than linger, a quiet agent (a
// message less often than once per linger) sends each at once, and a busy
// one sends a message per linger per broker, whatever its token rate: the
// server's read and route and the broker's wake-ups are paid per message.
//
// Chunks of one attempt keep their order: they are framed in order into
// one subject's messages, which are published in order on one connection.
type outbox struct {
	nc   *nats.Conn
	kick chan struct{}
	// linger bounds how long a chunk that may wait waits (0: none).
	linger time.Duration
	// hurry wakes a lingering flush when a chunk comes that may not wait
	// as long as the flush would.
	hurry chan struct{}
	// onLinger, if set (by a test), is called as a flush starts to wait.
	onLinger func()
	// last is when the outbox's goroutine last sent what was pending
	// (not when a kick found nothing left to send); only that goroutine
	// uses it.
	last time.Time
	// msgs and chunks count what was published.
	msgs, chunks interface{ Inc() }

	mu      sync.Mutex // guards everything below
	pending []*batchMsg
	spare   []*batchMsg
	acks    []acker // jobs to ack in the next flush, before its messages
	running bool    // the flushing goroutine runs; else put publishes at once
	// due is when the pending chunk that may wait least must leave, if one
	// may wait less than the linger (zero: none; an urgent chunk's is when
	// it was put); until is when the wait of a lingering flush ends (zero:
	// no flush waits).
	due, until time.Time
}

// anyWait is put's wait for a chunk that the linger alone bounds.
const anyWait = time.Duration(1<<63 - 1)

// acker is the part of a jetstream.Msg the outbox uses.
type acker interface{ Ack() error }

// batchMsg is one message being gathered for one reply subject.
type batchMsg struct {
	subject string
	buf     []byte
}

func newOutbox(nc *nats.Conn, linger time.Duration, msgs, chunks interface{ Inc() }) *outbox {
	return &outbox{nc: nc, kick: make(chan struct{}, 1), hurry: make(chan struct{}, 1), linger: max(linger, 0), msgs: msgs, chunks: chunks}
}

// put frames enc, the encoding of one chunk, into the pending message for
// subject. It does not keep enc. The chunk waits at most wait (anyWait:
// the linger), and so do those pending with it; one with a wait of zero
// or less is urgent: it leaves with them at once.
func (o *outbox) put(subject string, enc []byte, wait time.Duration) error {
	o.mu.Lock()
	m := o.open(subject)
	start := len(m.buf)
	m.buf = wire.AppendEncodedFrame(m.buf, enc)
	if len(m.buf) > wire.MaxFrameBatch && start > 1 {
		// This frame took the message over its bound (a big final chunk,
		// an embeddings answer): it starts a message of its own, so a
		// message outgrows the bound only by a chunk that alone does.
		frame := m.buf[start:]
		m.buf = m.buf[:start]
		next := o.fresh(subject)
		next.buf = append(next.buf, frame...)
	}
	o.chunks.Inc()
	if !o.running {
		// Not started (or stopped): no one would flush it later.
		err := o.flushLocked()
		o.mu.Unlock()
		return err
	}
	hurry := false
	if wait < o.linger {
		due := time.Now().Add(max(wait, 0))
		if o.due.IsZero() || due.Before(o.due) {
			o.due = due
		}
		// A flush that waits past it must look again.
		hurry = !o.until.IsZero() && due.Before(o.until)
	}
	o.mu.Unlock()
	if hurry {
		select {
		case o.hurry <- struct{}{}:
		default:
		}
	}
	select {
	case o.kick <- struct{}{}:
	default:
	}
	return nil
}

// ack acks m (a plain JetStream ack) in the next flush, ahead of the
// chunks pending then: a job's ack and its accepted chunk leave in one
// write. Acked alone, the ack was the connection's flusher's first work
// when the job's goroutine parked, and the chunks a second write (and a
// second read and wake-up of the server) after the outbox's turn.
func (o *outbox) ack(m acker) error {
	o.mu.Lock()
	if !o.running {
		o.mu.Unlock()
		return m.Ack()
	}
	o.acks = append(o.acks, m)
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
	return nil
}

// open returns the message being gathered for subject, starting one when
// there is none or the last is full. Called with mu held.
func (o *outbox) open(subject string) *batchMsg {
	for i := len(o.pending) - 1; i >= 0; i-- {
		if m := o.pending[i]; m.subject == subject {
			if len(m.buf) < wire.MaxFrameBatch {
				return m
			}
			break // full: a new message after it keeps the order
		}
	}
	return o.fresh(subject)
}

// fresh starts a message for subject after those pending. Called with mu
// held.
func (o *outbox) fresh(subject string) *batchMsg {
	var m *batchMsg
	if n := len(o.spare); n > 0 {
		m, o.spare = o.spare[n-1], o.spare[:n-1]
	} else {
		m = &batchMsg{buf: make([]byte, 0, 4096)}
	}
	m.subject = subject
	m.buf = append(m.buf[:0], wire.FrameMarker)
	o.pending = append(o.pending, m)
	return m
}

// flushLocked publishes every pending message. Called with mu held; it
// holds mu while it publishes (Publish only copies into the connection's
// buffer), so a stream waits at most one flush to add its chunk.
func (o *outbox) flushLocked() error {
	var first error
	for i, m := range o.acks {
		// It fails only on a closed connection (a reconnecting one buffers
		// it) or a job acked already. An unacked job is offered again after
		// AckWait, and the broker listens only to the first agent that
		// spoke for its attempt, as when an ack is lost in a failover.
		_ = m.Ack()
		o.acks[i] = nil
	}
	o.acks = o.acks[:0]
	for i, m := range o.pending {
		if err := o.nc.Publish(m.subject, m.buf); err != nil && first == nil {
			first = err
		}
		o.msgs.Inc()
		o.pending[i] = nil
		if cap(m.buf) <= 4*wire.MaxFrameBatch {
			o.spare = append(o.spare, m)
		}
	}
	o.pending = o.pending[:0]
	return first
}

// run flushes whenever a stream put a chunk, until stop.
func (o *outbox) run(stop <-chan struct{}) {
	var t *time.Timer
	for {
		select {
		case <-stop:
			return
		case <-o.kick:
		}
		// Let the goroutines that are ready to run go first: engine
		// readers the network poller just woke, about to add their chunks.
		// Whatever is at hand goes in this message; nothing waits for
		// more than the work already queued on this process.
		runtime.Gosched()
		o.mu.Lock()
		idle := len(o.pending) == 0 && len(o.acks) == 0
		o.mu.Unlock()
		if idle {
			continue // a kick whose chunks the last flush took
		}
		if o.linger > 0 {
			// Wait until a linger after the last message, or until the
			// pending chunk that may wait least must leave; a chunk that
			// comes meanwhile and may not wait that long ends the wait,
			// and the flush looks again. The end is set under the lock
			// that put reads it under, so a put either sees it or is seen.
			for {
				o.mu.Lock()
				end := o.last.Add(o.linger)
				if !o.due.IsZero() && o.due.Before(end) {
					end = o.due
				}
				wait := time.Until(end)
				if wait <= 0 {
					o.mu.Unlock()
					break
				}
				o.until = end
				o.mu.Unlock()
				if t == nil {
					t = time.NewTimer(wait)
				} else {
					t.Reset(wait)
				}
				if o.onLinger != nil {
					o.onLinger()
				}
				fired := false
				select {
				case <-stop:
					t.Stop()
					return
				case <-t.C:
					fired = true
				case <-o.hurry:
					t.Stop()
				}
				o.mu.Lock()
				o.until = time.Time{}
				o.mu.Unlock()
				if fired {
					break
				}
			}
			o.last = time.Now() // when this message leaves
		}
		o.mu.Lock()
		select {
		case <-o.hurry: // taken by this flush
		default:
		}
		o.due = time.Time{}
		_ = o.flushLocked() // a failed publish shows as a sequence gap at the broker
		o.mu.Unlock()
	}
}

// start runs the flushing goroutine until the returned function is
// called, which flushes what is left and makes later puts publish at once.
func (o *outbox) start() (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	o.mu.Lock()
	o.running = true
	o.mu.Unlock()
	go func() {
		defer close(exited)
		o.run(done)
	}()
	return func() {
		close(done)
		<-exited
		o.mu.Lock()
		o.running = false
		_ = o.flushLocked()
		o.mu.Unlock()
	}
}
