package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/alloctest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// replyOf is a reply message of the given chunks of c's attempt 0, with
// sequence numbers from seq.
func replyOf(t testing.TB, c *Call, seq uint64, chunks ...*wire.Chunk) *nats.Msg {
	t.Helper()
	data := []byte{wire.FrameMarker}
	for _, ch := range chunks {
		ch.RequestId, ch.AgentId, ch.Seq, ch.Secret = c.ID, "a1", seq, 42
		seq++
		var err error
		if data, err = wire.AppendFrame(data, ch); err != nil {
			t.Fatal(err)
		}
	}
	return &nats.Msg{Subject: "sy.reply.b.chunks", Data: data}
}

// directSink records what reaches it: the events added, and at each
// Flush the text written, or kept (result DirectPending).
type directSink struct {
	mu       sync.Mutex
	accepted []string // the agents of the accepted chunks it was told of
	added    []string // added and not flushed yet
	texts    []string // flushed
	flushes  int
	result   DirectResult
}

func (s *directSink) Add(evs []*wire.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		s.added = append(s.added, ev.GetDeltaText())
	}
}

func (s *directSink) Accepted(c *wire.Chunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accepted = append(s.accepted, c.GetAgentId())
}

func (s *directSink) Flush() DirectResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	if s.result == DirectDone {
		s.texts = append(s.texts, s.added...)
		s.added = s.added[:0]
	}
	return s.result
}

func (s *directSink) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.texts...)
}

// reader runs Next on c in a goroutine, as an SSE handler does, and
// reports what it read.
func reader(t *testing.T, c *Call) (<-chan string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan string, 64)
	go func() {
		defer close(out)
		for {
			ch, err := c.Next(ctx)
			switch {
			case errors.Is(err, ErrFlush):
				out <- "flush"
				continue
			case err != nil:
				out <- "err: " + err.Error()
				return
			}
			switch ch.GetKind() {
			case wire.Chunk_KIND_TOKEN:
				for _, ev := range ch.GetEvents() {
					out <- "token" + ev.GetDeltaText()
				}
			case wire.Chunk_KIND_FINAL:
				out <- "final"
				return
			}
		}
	}()
	return out, cancel
}

// waitParked waits until c's reader waits in Next.
func waitParked(t *testing.T, c *Call) {
	t.Helper()
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.waiting {
			return errors.New("the reader does not wait")
		}
		return nil
	})
}

// streaming returns a call whose reader has read the first token and
// waits in Next, with sink set as its direct sink, and what it reads.
func streaming(t *testing.T, sink *directSink) (*Broker, *Call, <-chan string) {
	t.Helper()
	b, c, _ := hopCall(t, 0)
	c.Deadline = time.Now().Add(time.Hour)
	out, stop := reader(t, c)
	t.Cleanup(stop)
	b.onReply(replyOf(t, c, 0, token(" first")))
	if got := <-out; got != "token first" {
		t.Fatalf("first token through Next: %q", got)
	}
	c.SetDirect(sink)
	waitParked(t, c)
	return b, c, out
}

// TestDirectTokens: after the first token, while the reader waits, token
// chunks go to the direct sink on the reply goroutine and the reader is
// not woken for them; its accounting (text sent, tokens) counts them, and
// the final chunk still comes through Next.
func TestDirectTokens(t *testing.T) {
	sink := &directSink{}
	b, c, out := streaming(t, sink)
	for i := range 5 {
		b.onReply(replyOf(t, c, uint64(1+i), token(fmt.Sprintf(" w%d", i))))
	}
	if got := strings.Join(sink.got(), ""); got != " w0 w1 w2 w3 w4" {
		t.Fatalf("the sink got %q", got)
	}
	// The reply goroutine (this one) did the reader's accounting.
	if c.tokens != 6 || c.sent.String() != " first w0 w1 w2 w3 w4" {
		t.Fatalf("accounting: %d tokens, sent %q", c.tokens, c.sent.String())
	}
	quietThenFinal(t, b, c, out, 6)
}

// quietThenFinal checks that c's reader was given nothing (its tokens went
// to the sink), then sends the final chunk as number seq and checks that
// the reader gets it through Next.
func quietThenFinal(t *testing.T, b *Broker, c *Call, out <-chan string, seq uint64) {
	t.Helper()
	select {
	case got := <-out:
		t.Fatalf("the reader was given %q for a direct token", got)
	default:
	}
	b.onReply(replyOf(t, c, seq, final()))
	if got := <-out; got != "final" {
		t.Fatalf("after the direct tokens, Next gave %q, want the final chunk", got)
	}
}

// TestDirectFirstToken: a sink set before the first token takes it too
// when the reader waits: the reply goroutine does the first token's
// accounting (the call's first token is set, so a later failure is a
// migration, not a retry), the reader is not woken for it, and the final
// chunk still comes through Next.
func TestDirectFirstToken(t *testing.T) {
	sink := &directSink{}
	b, c, _ := hopCall(t, 0)
	c.Deadline = time.Now().Add(time.Hour)
	c.Started = time.Now()
	c.SetDirect(sink)
	out, stop := reader(t, c)
	t.Cleanup(stop)
	waitParked(t, c)
	b.onReply(replyOf(t, c, 0, token(" first")))
	if got := strings.Join(sink.got(), ""); got != " first" {
		t.Fatalf("the sink got %q", got)
	}
	c.mu.Lock()
	first, sent := c.firstToken, c.sent.String()
	c.mu.Unlock()
	if first.IsZero() || sent != " first" {
		t.Fatalf("first token at %v, sent %q", first, sent)
	}
	quietThenFinal(t, b, c, out, 1)
}

// TestDirectAccepted: with a sink set and the reader waiting, a first
// regular attempt's accepted chunk is taken in on the reply goroutine (the
// attempt's agent, the sink told for its headers) and the reader is not
// woken for it; a PD attempt's, or one whose job is an affinity offer,
// still goes to the reader, which settles them.
func TestDirectAccepted(t *testing.T) {
	accepted := &wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED}
	t.Run("regular", func(t *testing.T) {
		sink := &directSink{}
		b, c, _ := hopCall(t, 0)
		c.Deadline, c.Started = time.Now().Add(time.Hour), time.Now()
		c.SetDirect(sink)
		out, stop := reader(t, c)
		t.Cleanup(stop)
		waitParked(t, c)
		b.onReply(replyOf(t, c, 0, accepted))
		sink.mu.Lock()
		got := sink.accepted
		sink.mu.Unlock()
		c.mu.Lock()
		agent, waiting := c.agent, c.waiting
		c.mu.Unlock()
		if len(got) != 1 || got[0] != "a1" || agent != "a1" || !waiting {
			t.Fatalf("sink told of %q, call's agent %q, reader waiting %v", got, agent, waiting)
		}
		b.onReply(replyOf(t, c, 1, token(" first")))
		if got := strings.Join(sink.got(), ""); got != " first" {
			t.Fatalf("the sink got %q", got)
		}
		quietThenFinal(t, b, c, out, 2)
	})
	for _, tc := range []struct {
		name string
		set  func(c *Call)
	}{
		{"pd", func(c *Call) { c.Route = dispatch.RoutePD }},
		{"offer", func(c *Call) { c.aff.timer = time.NewTimer(time.Hour) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := &directSink{}
			b, c, _ := hopCall(t, 0)
			c.Deadline, c.Started = time.Now().Add(time.Hour), time.Now()
			tc.set(c)
			c.SetDirect(sink)
			out, stop := reader(t, c)
			t.Cleanup(stop)
			waitParked(t, c)
			b.onReply(replyOf(t, c, 0, accepted))
			// The reader takes it (it reports nothing for an accepted
			// chunk) and waits again.
			testwait.For(t, 5*time.Second, time.Millisecond, func() error {
				c.mu.Lock()
				defer c.mu.Unlock()
				if c.qhead != len(c.queue) || !c.waiting {
					return errors.New("the reader has not taken the accepted chunk")
				}
				return nil
			})
			if len(sink.accepted) != 0 {
				t.Fatalf("the sink was told of %q", sink.accepted)
			}
			b.onReply(replyOf(t, c, 1, final()))
			if got := <-out; got != "final" {
				t.Fatalf("Next gave %q, want the final chunk", got)
			}
		})
	}
}

// TestDirectPendingKeepsOrder: a sink that could not write everything
// stops the direct path; Next returns ErrFlush before any chunk queued
// after it, and once resumed the sink takes tokens again.
func TestDirectPendingKeepsOrder(t *testing.T) {
	sink := &directSink{result: DirectPending}
	b, c, out := streaming(t, sink)
	// Two tokens in one message: both added, one flush, which keeps them.
	b.onReply(replyOf(t, c, 1, token(" slow"), token(" too")))
	if got := <-out; got != "flush" {
		t.Fatalf("after a pending write Next gave %q, want ErrFlush", got)
	}
	if sink.flushes != 1 || len(sink.added) != 2 {
		t.Fatalf("%d flushes for %d tokens added, want one for two", sink.flushes, len(sink.added))
	}
	// Until the reader resumes, tokens are queued behind what it flushes.
	b.onReply(replyOf(t, c, 3, token(" queued")))
	if got := <-out; got != "token queued" {
		t.Fatalf("then %q, want the token queued behind the pending ones", got)
	}
	sink.mu.Lock()
	sink.result, sink.added = DirectDone, nil // the reader flushed them
	sink.mu.Unlock()
	c.ResumeDirect()
	waitParked(t, c)
	b.onReply(replyOf(t, c, 4, token(" again")))
	if got := sink.got(); len(got) != 1 || got[0] != " again" {
		t.Fatalf("after ResumeDirect the sink wrote %q", got)
	}
}

// TestDirectReaderWokeFirst: events added to the sink whose reader woke
// before the flush (here: a final chunk of the same message, queued
// behind them) are the reader's to write: no flush from the reply
// goroutine, and Next says ErrFlush if the reader asks again.
func TestDirectReaderWokeFirst(t *testing.T) {
	sink := &directSink{}
	b, c, out := streaming(t, sink)
	b.onReply(replyOf(t, c, 1, token(" last"), final()))
	// The reader may come before the flush (the final at once) or after
	// it (ErrFlush first): the writer's bytes are in order either way.
	got := <-out
	if got == "flush" {
		got = <-out
	}
	if got != "final" {
		t.Fatalf("Next gave %q, want the final chunk", got)
	}
	if sink.flushes != 0 || len(sink.added) != 1 {
		t.Fatalf("%d flushes, %d added: the reply goroutine wrote on the reader's writer", sink.flushes, len(sink.added))
	}
}

// TestDirectOffAfterNewAttempt: a new attempt's chunks never go to the
// sink (a migration's are checked against the text already sent).
func TestDirectOffAfterNewAttempt(t *testing.T) {
	b, c, _ := hopCall(t, 0)
	c.Deadline = time.Now().Add(time.Hour)
	c.firstToken = time.Now()
	sink := &directSink{}
	c.SetDirect(sink)
	c.mu.Lock()
	c.directOff = true // what abandon sets
	c.waiting = true
	c.mu.Unlock()
	b.onReply(replyOf(t, c, 0, token(" x")))
	if len(sink.added) != 0 {
		t.Fatal("a chunk went to the sink after a new attempt")
	}
	if ch, _, _ := c.next(); ch == nil || ch.GetEvents()[0].GetDeltaText() != " x" {
		t.Fatalf("the chunk was not queued: %v", ch)
	}
}

// TestDirectAllocs: a token handed to the direct sink allocates nothing on
// the reply goroutine.
func TestDirectAllocs(t *testing.T) {
	b, c, m := hopCall(t, 1)
	c.Deadline = time.Now().Add(time.Hour)
	c.firstToken = time.Now()
	c.SetDirect(nopSink{})
	// The reader waits (as in Next), and nothing is queued; the first run
	// warms the chunk pool and the observers. The least of a few batches
	// (see alloctest).
	allocs := alloctest.PerRun(t, 200, func() {
		c.mu.Lock()
		c.nextSeq, c.waiting = 0, true
		c.mu.Unlock()
		b.onReply(m)
	})
	if n := len(c.queue) - c.qhead; n > 0 {
		t.Fatalf("%d chunks queued: the direct path was not taken", n)
	}
	if allocs > 0 {
		t.Fatalf("a direct token: %.1f allocations, want 0", allocs)
	}
}

// nopSink writes everything at once.
type nopSink struct{}

func (nopSink) Add([]*wire.Event)    {}
func (nopSink) Accepted(*wire.Chunk) {}
func (nopSink) Flush() DirectResult  { return DirectDone }
