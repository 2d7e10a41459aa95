package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// Bounds of one token message: a burst of engine chunks that arrived
// together goes out as one NATS message of at most this many events or
// bytes, so a fast engine costs one publish per burst, not per token, and
// no message grows without bound.
const (
	maxBatchEvents = 64
	maxBatchBytes  = 64 << 10
)

// stream sends the chunks of one attempt with strictly increasing sequence
// numbers. Core NATS keeps the order of one connection's publishes, so the
// broker sees them in order unless one is lost, which the sequence exposes.
type stream struct {
	a            *Agent
	job          *wire.Job
	seq          uint64
	buf          []byte
	usage        *wire.Usage
	usageRaw     []byte
	finishReason string
	tokens       int
	// answered is the bytes of engine output emitted, bounded by
	// Config.MaxAnswerBytes; events counts the engine's events for the
	// progress watch, which reads it from its own goroutine.
	answered int64
	events   atomic.Uint64
	ended    bool
	stage    wire.Chunk_Stage
	called   time.Time // when the engine was called

	// The token message being gathered: events held while the engine's
	// next chunk is already at hand.
	batch      wire.Chunk
	batchBytes int
	// The events of token messages, reused from one message to the next:
	// a message is encoded (copied) when it is sent, so neither the
	// structs nor the bytes of held events (in held, emptied at each
	// message) outlive it.
	evs  []*wire.Event
	held []byte
	// First homes of the above, of buf and of usage, inside the stream:
	// a short answer's few events (role, token, finish) and its usage
	// cost no allocation of their own. Longer ones grow past them once.
	evStore    [4]wire.Event
	evPtrs     [4]*wire.Event
	batchPtrs  [4]*wire.Event
	heldStore  [1024]byte
	bufStore   [1024]byte
	usageStore wire.Usage
	usageBytes [256]byte

	// sendMu orders send against resend: buf holds the last chunk sent
	// until the next one is encoded.
	sendMu sync.Mutex
	// sentText is set once a token chunk with text went out (under
	// sendMu).
	sentText bool
	// lastToken is when the last token chunk was sent (under sendMu).
	lastToken time.Time

	// muted is set by a cancel: a cancelled attempt sends nothing more,
	// whatever its engine still does (a PD decode leg runs on to take its
	// hand-off).
	muted atomic.Bool
	// mu orders the keep-alive goroutine against the attempt's first chunk
	// after accepted, and a PD-safe cancel against the engine's first
	// chunk. The engine's goroutine writes spoke and tookKV only under mu;
	// it alone reads them without.
	mu        sync.Mutex
	spoke     bool                    // a token, final or error went out, or the job ended: no more keep-alives
	tookKV    bool                    // the engine produced its first chunk: a decode leg read its hand-off
	abortAtKV context.CancelCauseFunc // a cancel that waits for the engine's first chunk
	kaTimer   *time.Timer             // the next keep-alive, until the attempt speaks
	kaCtx     context.Context         // the attempt's, for its keep-alives
	kaEvery   time.Duration
	kaBuf     []byte // a keep-alive's encoding, reused
	// final is the attempt's final chunk (see finish).
	final wire.Chunk
}

// init readies a zero stream in place (a job's, inside its jobRun).
func (s *stream) init(a *Agent, job *wire.Job) {
	s.a, s.job = a, job
	s.buf = s.bufStore[:0]
	s.held = s.heldStore[:0]
	s.usageRaw = s.usageBytes[:0]
	for i := range s.evStore {
		s.evPtrs[i] = &s.evStore[i]
	}
	s.evs = s.evPtrs[:]
	s.batch.Events = s.batchPtrs[:0]
}

func (s *stream) send(c *wire.Chunk) error {
	if c.Kind != wire.Chunk_KIND_ACCEPTED && !s.spoke {
		s.quiet()
	}
	if s.muted.Load() {
		return nil
	}
	c.RequestId = s.job.GetRequestId()
	c.Attempt = s.job.GetAttempt()
	c.Seq = s.seq
	c.AgentId = s.a.cfg.ID
	c.Stage = s.stage
	s.seq++
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	// The first text and the end leave at once, with whatever the outbox
	// holds then; the rest may wait for its linger. The client waits for
	// neither accepted (the broker's) nor a keep-alive. Token chunks
	// before the first text (an engine's role-only first chunk, reasoning)
	// do not wait either: the client's first token is the first text. A
	// later token waits at most half the time since the one before, so
	// it leaves before the next comes: however fast the engine, the
	// client gets its tokens one at a time, as the engine made them.
	wait := anyWait
	switch c.Kind {
	case wire.Chunk_KIND_FINAL, wire.Chunk_KIND_ERROR:
		wait = 0
	case wire.Chunk_KIND_TOKEN:
		now := time.Now()
		if !s.sentText {
			wait = 0
			s.sentText = hasText(c)
		} else {
			wait = now.Sub(s.lastToken) / 2
		}
		s.lastToken = now
	}
	var err error
	s.buf, err = s.publish(s.buf, c, wait)
	return err
}

// hasText reports whether one of c's events carries text.
func hasText(c *wire.Chunk) bool {
	for _, ev := range c.GetEvents() {
		if ev.GetDeltaText() != "" {
			return true
		}
	}
	return false
}

// publish sends c on the job's reply subject, framed through the agent's
// outbox, with the attempt's secret. It returns buf holding c's encoding,
// which resend sends again after a reconnect. The chunk waits in the
// outbox at most wait (see outbox.put).
func (s *stream) publish(buf []byte, c *wire.Chunk, wait time.Duration) ([]byte, error) {
	c.Secret = s.job.GetSecret()
	buf, err := wire.AppendChunk(buf[:0], c)
	if err != nil {
		return buf[:0], err
	}
	return buf, s.a.out.put(s.job.GetReplySubject(), buf, wait)
}

// lastSent returns the last chunk sent as a reply message of its own, nil
// if none or muted.
func (s *stream) lastSent() []byte {
	if s.muted.Load() {
		return nil
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if len(s.buf) == 0 {
		return nil
	}
	return oneFrame(s.buf)
}

// oneFrame returns a new reply message holding enc, one chunk's encoding.
func oneFrame(enc []byte) []byte {
	msg := make([]byte, 1, 1+binary.MaxVarintLen64+len(enc))
	msg[0] = wire.FrameMarker
	return wire.AppendEncodedFrame(msg, enc)
}

// resend publishes the last chunk sent again. After a reconnect it is what
// lets the broker see the chunks the lost NATS node took with it: a chunk
// it has is dropped as a duplicate, the last one missing (a stream's
// final) is taken, and one after a hole shows the hole, which the broker
// repairs with a migration instead of waiting for its stall timeout.
func (s *stream) resend() {
	if s.muted.Load() {
		return
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if len(s.buf) == 0 {
		return
	}
	if err := s.a.nc.Publish(s.job.GetReplySubject(), oneFrame(s.buf)); err != nil {
		s.a.log.Debug("chunk not sent again", "request", s.job.GetRequestId(), "err", err)
	}
}

// quiet ends the keep-alives: the attempt spoke, or ended.
func (s *stream) quiet() {
	s.mu.Lock()
	if !s.spoke {
		s.spoke = true
		if s.kaTimer != nil {
			s.kaTimer.Stop()
		}
	}
	s.mu.Unlock()
}

// keepalive starts sending a keep-alive chunk every interval until the
// attempt speaks or ends (quiet), is cancelled or ctx ends. A keep-alive is
// outside the sequence: it repeats the sequence number of the last chunk
// sent (accepted's), so the stream's numbering is untouched and a broker
// that does not know the kind drops it as a duplicate. It is a timer, not
// a goroutine: most attempts speak before the first tick, and a short job
// should not pay for a parked goroutine and a ticker it never uses.
func (s *stream) keepalive(ctx context.Context, every time.Duration) {
	if every <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spoke || s.kaTimer != nil {
		return
	}
	s.kaCtx, s.kaEvery = ctx, every
	s.kaTimer = time.AfterFunc(every, s.tick)
}

// tick sends a keep-alive (see keepalive) and sets the next.
func (s *stream) tick() {
	s.mu.Lock()
	if s.spoke || s.muted.Load() || s.kaCtx.Err() != nil {
		s.mu.Unlock()
		return
	}
	c := &wire.Chunk{
		Kind: wire.Chunk_KIND_KEEPALIVE, RequestId: s.job.GetRequestId(), Attempt: s.job.GetAttempt(),
		Seq: max(s.seq, 1) - 1, AgentId: s.a.cfg.ID, Stage: s.stage,
	}
	var err error
	s.kaBuf, err = s.publish(s.kaBuf, c, anyWait)
	s.kaTimer.Reset(s.kaEvery)
	s.mu.Unlock()
	if err != nil {
		s.a.log.Debug("keep-alive not sent", "request", s.job.GetRequestId(), "err", err)
	}
}

// cancelAtKV is the PD-safe cancel of a decode leg: the attempt goes
// silent now, but the engine request is aborted only once the engine has
// produced its first chunk, that is once it has read the hand-off's KV
// from the prefill engine, so no KV stays held there for a decode that
// never comes.
func (s *stream) cancelAtKV(cancel context.CancelCauseFunc) {
	s.muted.Store(true)
	s.mu.Lock()
	took := s.tookKV
	if !took {
		s.abortAtKV = cancel
	}
	s.mu.Unlock()
	if took {
		cancel(errCancelled)
	}
}

// emit is the Engine's callback for one engine chunk (see Emit).
func (s *stream) emit(raw []byte, more bool) error {
	if !s.tookKV {
		s.mu.Lock()
		s.tookKV = true
		abort := s.abortAtKV
		s.mu.Unlock()
		if abort != nil {
			abort(errCancelled)
			return errCancelled
		}
	}
	s.events.Add(1)
	if s.answered += int64(len(raw)); s.answered > s.a.cfg.MaxAnswerBytes {
		return &wire.Error{Code: wire.CodeEngineOutputTooLarge, Message: fmt.Sprintf("the engine's answer passed %d bytes (--max-answer-bytes)", s.a.cfg.MaxAnswerBytes)}
	}
	// Only the few fields the broker needs are read; everything else
	// travels in Event.raw untouched.
	f, err := oaiformat.ReadChunk(raw)
	if err != nil {
		return &wire.Error{Code: wire.CodeEngine, Message: "engine sent an undecodable chunk: " + err.Error()}
	}
	if f.HasUsage {
		s.usageStore = wire.Usage{PromptTokens: f.PromptTokens, CompletionTokens: f.CompletionTokens, TotalTokens: f.TotalTokens}
		s.usage = &s.usageStore
	}
	if f.Choices == 0 {
		// The usage chunk: held for the final message, where the broker
		// passes it on only if the client asked for usage.
		if f.HasUsage {
			s.usageRaw = append(s.usageRaw[:0], raw...)
		}
		if !more {
			return s.flush()
		}
		return nil
	}
	i := len(s.batch.Events)
	if i == len(s.evs) {
		// More events held than ever in this stream: as many again, in
		// one block, and room for them in the message.
		blk := make([]wire.Event, i)
		evs := make([]*wire.Event, 2*i)
		copy(evs, s.evs)
		for j := range blk {
			evs[i+j] = &blk[j]
		}
		s.evs = evs
		s.batch.Events = append(make([]*wire.Event, 0, 2*i), s.batch.Events...)
	}
	ev := s.evs[i]
	ev.Raw, ev.DeltaText, ev.FinishReason = raw, f.Text, ""
	if f.HasFinish {
		ev.FinishReason = f.FinishReason
		s.finishReason = f.FinishReason
	}
	if ev.DeltaText != "" {
		if s.tokens == 0 && !s.called.IsZero() {
			s.a.metrics.ttft.Observe(time.Since(s.called).Seconds())
		}
		s.tokens++
	}
	s.batch.Events = append(s.batch.Events, ev)
	s.batchBytes += len(raw)
	if more && len(s.batch.Events) < maxBatchEvents && s.batchBytes < maxBatchBytes {
		// The engine's next chunk is already here: hold this one (its
		// bytes are the engine's buffer, reused after we return). Should
		// held grow, the events held before keep the old array's bytes.
		start := len(s.held)
		s.held = append(s.held, raw...)
		ev.Raw = s.held[start:len(s.held):len(s.held)]
		return nil
	}
	return s.flush()
}

// flush sends the events held, if any, as one token message.
func (s *stream) flush() error {
	if len(s.batch.Events) == 0 {
		return nil
	}
	s.batch.Kind = wire.Chunk_KIND_TOKEN
	err := s.send(&s.batch)
	for _, ev := range s.batch.Events {
		// The engine's buffer or held's, reused: not ours to keep.
		ev.Raw, ev.DeltaText = nil, ""
	}
	s.batch.Events = s.batch.Events[:0]
	s.batchBytes = 0
	s.held = s.held[:0]
	return err
}

func (s *stream) finish() {
	if s.ended {
		return
	}
	s.ended = true
	s.quiet()
	if err := s.flush(); err != nil {
		s.a.log.Warn("token chunk not sent", "request", s.job.GetRequestId(), "err", err)
	}
	s.final = wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Raw: s.usageRaw, FinishReason: s.finishReason, Usage: s.usage}
	if err := s.send(&s.final); err != nil {
		s.a.log.Warn("final chunk not sent", "request", s.job.GetRequestId(), "err", err)
	}
}

func (s *stream) fail(e *wire.Error) {
	if s.ended {
		return
	}
	s.ended = true
	s.quiet()
	// What the engine produced before it failed still reaches the client.
	if err := s.flush(); err != nil {
		s.a.log.Warn("token chunk not sent", "request", s.job.GetRequestId(), "err", err)
	}
	if err := s.send(&wire.Chunk{Kind: wire.Chunk_KIND_ERROR, Error: e}); err != nil {
		s.a.log.Warn("error chunk not sent", "request", s.job.GetRequestId(), "err", err)
	}
}
