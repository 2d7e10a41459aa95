package broker

import (
	"fmt"

	"github.com/switchyard-ai/switchyard/wire"
)

// inbox is the hand-off from the reply goroutine to the reader: the reply
// goroutine appends relayed chunks (relay) and records a failure or a
// gap; the reader takes them (next). Call.mu guards every field.
type inbox struct {
	// queue holds the chunks relayed and not yet read, from qhead on, and
	// qbytes what they cost (see queuedCost), at most Config.BufferBytes
	// for a stream: a slice that grows with what a slow reader leaves, not
	// a channel of the bound's size per call; past the bound the call
	// fails with ErrSlowReader, so the reply goroutine never waits for a
	// reader. answered is the bytes of answer relayed to the call (see
	// answerBytes), bounded by Config.MaxAnswerBytes. waiting tells that
	// the reader found it empty and waits on Call.ready, so a chunk wakes
	// the reader only then: a reader busy writing takes the next chunk
	// without a channel operation.
	queue    []queuedChunk
	qhead    int
	qbytes   int64
	answered int64
	waiting  bool
	// failErr, once set, ends the call (see fail); broken is a gap found
	// in an attempt's sequence, for the reader to repair. Both wake the
	// reader through ready: its select waits on ready, the context and one
	// timer, not on a channel per event.
	failErr error
	broken  *brokenAttempt
}

// queuedChunk is a chunk in a call's inbox and what it costs there.
type queuedChunk struct {
	ch   *wire.Chunk
	cost int64
}

// What a queued chunk holds beyond its encoding (which its decoding
// aliases): the decoded chunk, and each event's struct and pointer.
const (
	chunkOverhead = 192
	eventOverhead = 96
)

// queuedCost is what chunk, decoded from an encoding of n bytes, holds
// while it waits in an inbox.
func queuedCost(n int, chunk *wire.Chunk) int64 {
	return int64(n + chunkOverhead + eventOverhead*len(chunk.GetEvents()))
}

// answerBytes is the engine output chunk carries: what the client gets
// of it, its events' JSON and the final chunk's.
func answerBytes(chunk *wire.Chunk) int64 {
	n := len(chunk.GetRaw())
	for _, ev := range chunk.GetEvents() {
		n += len(ev.GetRaw())
	}
	return int64(n)
}

// add queues chunk, decoded from size bytes, within the call's bounds on
// bytes: maxAnswer on the answer, and for a stream (a client that reads as
// it goes) bufferBytes on what waits unread; id names the request in the
// errors. It reports whether the reader waits for a chunk, and must be
// woken. A chunk past a bound is not queued: the bound's error becomes the
// call's failure and is returned. Call.mu is held.
func (q *inbox) add(chunk *wire.Chunk, size int, stream bool, maxAnswer, bufferBytes int64, id string) (wake bool, err error) {
	if k := chunk.GetKind(); k == wire.Chunk_KIND_TOKEN || k == wire.Chunk_KIND_FINAL {
		q.answered += answerBytes(chunk)
		if q.answered > maxAnswer {
			q.failErr = fmt.Errorf("%w: request %s: the engine's answer passed %d bytes (--max-answer-bytes)", ErrAnswerTooLarge, id, maxAnswer)
			return false, q.failErr
		}
	}
	cost := queuedCost(size, chunk)
	if stream && q.qbytes+cost > bufferBytes && q.qhead < len(q.queue) {
		// A stream's client reads as it goes; an answer read whole is
		// bounded by maxAnswer alone. One chunk, however large, always
		// fits an empty queue.
		q.failErr = fmt.Errorf("%w: request %s: client reads too slowly (%d bytes waiting, --answer-buffer-bytes %d)", ErrSlowReader, id, q.qbytes, bufferBytes)
		return false, q.failErr
	}
	q.qbytes += cost
	q.queue = append(q.queue, queuedChunk{chunk, cost})
	wake = q.waiting
	q.waiting = false
	return wake, nil
}

// take takes the first queued chunk. When there is none it returns the
// call's failure, or else takes a gap found in an attempt's sequence
// (current: in attempt, the one still running), or else returns nothing
// with waiting set: the next relayed chunk then signals Call.ready.
// Call.mu is held.
func (q *inbox) take(attempt uint32) (*wire.Chunk, *brokenAttempt, error) {
	if q.qhead == len(q.queue) {
		if q.failErr != nil {
			return nil, nil, q.failErr
		}
		if br := q.broken; br != nil {
			q.broken = nil
			br.current = br.attempt == attempt
			return nil, br, nil
		}
		q.waiting = true
		return nil, nil, nil
	}
	// The reader takes a chunk: it does not wait (it may have woken for
	// its timer or context with waiting still set).
	q.waiting = false
	c := q.queue[q.qhead]
	q.queue[q.qhead] = queuedChunk{}
	q.qbytes -= c.cost
	if q.qhead++; q.qhead == len(q.queue) {
		q.queue, q.qhead = q.queue[:0], 0
	}
	return c.ch, nil, nil
}

// failed records err as the call's failure unless one is recorded: the
// first stays. Call.mu is held.
func (q *inbox) failed(err error) {
	if q.failErr == nil {
		q.failErr = err
	}
}

// buffered is how many chunks wait to be read. Call.mu is held.
func (q *inbox) buffered() int { return len(q.queue) - q.qhead }

// Buffered reports how many chunks wait to be read. A writer that finds
// more waiting can write them before it flushes, one flush for a burst.
func (c *Call) Buffered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buffered()
}
