package broker

import (
	"errors"

	"github.com/switchyard-ai/switchyard/wire"
)

// DirectResult is what a direct sink (see Call.SetDirect) made of the
// events it was given.
type DirectResult uint8

const (
	// DirectDone: the events are written.
	DirectDone DirectResult = iota
	// DirectPending: the sink took the events, but some of its bytes wait
	// in its writer (the client reads slowly): the reader must flush them.
	DirectPending
	// DirectFailed: the write failed; the reader learns how from its
	// writer.
	DirectFailed
)

// ErrFlush is what Next returns when a direct sink left work for the
// reader (DirectPending or DirectFailed): the reader flushes its writer
// (or ends the request on its error), calls ResumeDirect and reads on.
// It is not the call's end.
var ErrFlush = errors.New("broker: the direct sink left bytes for the reader to write")

// SetDirect lets the reply goroutine hand the call's token chunks to sink
// itself while the reader waits in Next, instead of queueing each and
// waking the reader for it: a streaming reader whose writer can write
// without waiting (internal/h1's WriteNow) then costs no goroutine
// wake-up per token, the largest cost of a token in the broker after its
// write(2). Call it once the response's head is out (after the first
// token was read); the final, error and keep-alive chunks, and every chunk
// while the reader is not waiting or something else is queued, still come
// through Next, in order.
//
// sink runs on the reply goroutine with the call's lock held: it must not
// block, nor keep the events after it returns. Between the reader's Next
// calls it is the only user of the reader's writer; Next does not return
// until a sink call in progress has returned. No chunk goes to it after a
// migration (whose chunks the reader checks against the text already
// sent).
func (c *Call) SetDirect(sink func(events []*wire.Event) DirectResult) {
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
		len(chunk.GetEvents()) > 0 && !c.firstToken.IsZero()
}

// deliverDirect does for chunk what the reader's Next and its writer
// would: the reader's bookkeeping (deliver), then the sink's write. It
// reports whether the reader must be woken to finish the write. c.mu is
// held, and the reader waits (see directOK), so the reader's state is
// this goroutine's until c.mu is released.
func (c *Call) deliverDirect(chunk *wire.Chunk) (wake bool) {
	now := c.b.now()
	c.heard, c.asked = now, now
	c.deliver(chunk)
	c.b.metrics.directChunks.Inc()
	if c.direct(chunk.GetEvents()) == DirectDone {
		return false
	}
	// The writer holds bytes, or failed: the reader takes over, and no
	// chunk goes past it until it has flushed.
	c.directStop, c.flushAsk, c.waiting = true, true, false
	return true
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
