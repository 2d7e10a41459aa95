package broker

import (
	"errors"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/wire"
)

// DirectSink takes a call's token events on the broker's reply goroutine
// (see Call.SetDirect): Add puts them in the reader's writer without
// writing, Flush writes what was added without waiting. Neither may
// block, and Add must not keep the events.
type DirectSink interface {
	Add(events []*wire.Event)
	Flush() DirectResult
	// Accepted is told of the attempt's accepted chunk when the reply
	// goroutine took it in (see SetDirect), before any of its tokens.
	Accepted(chunk *wire.Chunk)
}

// DirectResult is what a direct sink's Flush made of the bytes it held.
type DirectResult uint8

const (
	// DirectDone: everything added is written.
	DirectDone DirectResult = iota
	// DirectPending: some of it waits in the writer (the client reads
	// slowly): the reader must flush it.
	DirectPending
	// DirectFailed: the write failed; the reader learns how from its
	// writer.
	DirectFailed
)

// ErrFlush is what Next returns when its writer holds bytes a direct sink
// added and did not write (DirectPending or DirectFailed, or the reader
// woke before the reply goroutine flushed them): the reader flushes its
// writer (or ends the request on its error), calls ResumeDirect and reads
// on. It is not the call's end.
var ErrFlush = errors.New("broker: the direct sink left bytes for the reader to write")

// SetDirect lets the reply goroutine hand the call's token chunks to sink
// while the reader waits in Next, instead of queueing each and waking the
// reader for it: a streaming reader whose writer can write without
// waiting (internal/h1) then costs no goroutine wake-up per token, the
// largest cost of a token in the broker after its write(2). The reply
// goroutine adds the tokens of every message to their sinks and flushes
// them once it has no message left waiting, so a busy broker writes a
// stream's burst of tokens in one write(2), as a reader that found them
// queued would. The first token may go to the sink too: the sink then
// starts the response (its head goes out with that token), and the call
// no longer retries (see Call), as when the reader hands a token out.
// The accepted chunk of a plain attempt (the first, on the regular route,
// with no affinity offer waiting) is taken in there as well, and the sink
// told of it (Accepted): a stream's reader then wakes once, at its end.
// The final, error and keep-alive chunks, the accepted chunks of other
// attempts, and every chunk while the reader is not waiting or something
// else is queued, still come through Next, in order (the sink's writer
// is the reader's).
//
// The sink runs with the call's lock held; Next does not return while a
// sink call is in progress, and from its return until the reader waits
// again no sink call is made. No chunk goes to it after a retry or a
// migration (whose chunks the reader checks against the text sent).
func (c *Call) SetDirect(sink DirectSink) {
	c.mu.Lock()
	c.direct = sink
	c.mu.Unlock()
}

// ResumeDirect lets chunks go to the direct sink again after the reader
// flushed what a sink left (see ErrFlush).
func (c *Call) ResumeDirect() {
	c.mu.Lock()
	c.directStop = false
	c.mu.Unlock()
}

// directOK reports whether chunk, the current attempt's next in
// sequence, may go to the direct sink now. c.mu is held.
func (c *Call) directOK(chunk *wire.Chunk) bool {
	return c.direct != nil && !c.directOff && !c.directStop && c.waiting &&
		c.qhead == len(c.queue) && c.failErr == nil && c.broken == nil &&
		chunk.GetKind() == wire.Chunk_KIND_TOKEN && chunk.GetStage() != wire.Chunk_STAGE_PREFILL &&
		len(chunk.GetEvents()) > 0
}

// acceptOK reports whether chunk, the current attempt's next in
// sequence, is an accepted chunk the reply goroutine may take in for the
// waiting reader: that of a first attempt on the regular route whose job
// was no affinity offer (whose wait the reader's select watches, and
// whose end the reader settles). c.mu is held.
func (c *Call) acceptOK(chunk *wire.Chunk) bool {
	return chunk.GetKind() == wire.Chunk_KIND_ACCEPTED && chunk.GetStage() != wire.Chunk_STAGE_PREFILL &&
		c.direct != nil && !c.directOff && !c.directStop && c.waiting &&
		c.qhead == len(c.queue) && c.failErr == nil && c.broken == nil &&
		c.Route == dispatch.RouteRegular && c.aff.move == nil && c.aff.timer == nil && c.migrations == 0
}

// acceptDirect does for an accepted chunk what the reader's Next would.
// c.mu is held, and the reader waits (see acceptOK): its state is this
// goroutine's until c.mu is released.
func (c *Call) acceptDirect(chunk *wire.Chunk) {
	c.heard = c.b.now()
	c.onAccepted(chunk)
	c.b.metrics.directAccepted.Inc()
	c.direct.Accepted(chunk)
}

// deliverDirect does for chunk what the reader's Next would (deliver's
// accounting) and adds its events to the sink; it reports whether the
// call's sink now holds events to flush and did not before. c.mu is held, and
// the reader waits (see directOK): its state is this goroutine's until
// c.mu is released.
func (c *Call) deliverDirect(chunk *wire.Chunk) (newlyUnsent bool) {
	now := c.b.now()
	c.heard, c.asked = now, now
	c.deliver(chunk)
	c.b.metrics.directChunks.Inc()
	c.direct.Add(chunk.GetEvents())
	if c.unsent {
		return false
	}
	c.unsent = true
	return true
}

// flushDirect writes what the direct sinks of the calls in Broker.unsent hold. A
// sink that cannot write it all, or whose reader woke meanwhile, leaves
// the rest to the reader: it is woken, and Next returns ErrFlush before
// anything else.
func (b *Broker) flushDirect() {
	for i, c := range b.unsent {
		b.unsent[i] = nil
		c.mu.Lock()
		c.unsent = false
		wake := false
		switch {
		case c.waiting && !c.directStop:
			if c.direct.Flush() != DirectDone {
				c.directStop, c.flushAsk, c.waiting = true, true, false
				wake = true
			}
		default:
			// The reader woke (a timer, a queued chunk): the writer is
			// its own again, and it writes what was added first.
			c.flushAsk = true
		}
		c.mu.Unlock()
		if wake {
			c.wake()
		}
	}
	b.unsent = b.unsent[:0]
}

// flushEvery bounds the reply messages whose direct tokens wait for one
// flush while more messages keep coming.
const flushEvery = 16

// morePending reports whether more messages wait for the reply goroutine
// after m: their tokens may join the same flush. nats.go counts the
// message being handled as pending until its callback returns.
func morePending(m *nats.Msg) bool {
	if m.Sub == nil {
		return false
	}
	n, _, err := m.Sub.Pending()
	return err == nil && n > 1
}

// claim makes the reader the owner of its state again after a wake-up
// that did not come through a queued chunk (a timer, its context, an
// affinity offer): from here no chunk goes to the direct sink until the
// reader waits again, and a sink call in progress has returned.
func (c *Call) claim() {
	c.mu.Lock()
	c.waiting = false
	c.mu.Unlock()
}
