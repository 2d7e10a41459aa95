package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// countingEngine answers every request with one token after delay and
// records how many it ran and the most at once.
type countingEngine struct {
	delay      time.Duration
	calls, now atomic.Int32
	peak       atomic.Int32
}

func (e *countingEngine) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	e.calls.Add(1)
	n := e.now.Add(1)
	defer e.now.Add(-1)
	for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
	}
	select {
	case <-time.After(e.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := emit([]byte(`{"id":"x","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":"stop"}]}`), false); err != nil {
		return err
	}
	return emit([]byte(`{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`), false)
}

type fixture struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	eng   *countingEngine
	agent *agent.Agent
	stop  context.CancelFunc // SIGTERM
	done  chan error         // what Run returned
}

// jobsServer starts a JetStream server with the broker's jobs stream and
// returns a connection for the test (the broker's side) and one for the
// agent.
func jobsServer(t *testing.T) (nc, anc *nats.Conn) {
	t.Helper()
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	b, err := broker.New(nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	anc, err = nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(anc.Close)
	return nc, anc
}

func start(t *testing.T, slots int, delay time.Duration, opts ...func(*agent.Config)) *fixture {
	t.Helper()
	nc, anc := jobsServer(t)
	eng := &countingEngine{delay: delay}
	cfg := agent.Config{ID: "a1", Model: "m", Slots: slots, Heartbeat: 50 * time.Millisecond, PullWait: 200 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := agent.New(anc, eng, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		err := <-done
		done <- err
		if err != nil {
			t.Errorf("agent returned %v", err)
		}
	})
	js, _ := jetstream.New(nc)
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := a.State(); st != wire.StateReady {
			return fmt.Errorf("agent is %s, never ready", st)
		}
		return nil
	})
	return &fixture{nc: nc, js: js, eng: eng, agent: a, stop: cancel, done: done}
}

// publish sends a job and returns a subscription to its replies.
func (f *fixture) publish(t *testing.T, id string, deadline time.Time) *nats.Subscription {
	t.Helper()
	return f.publishAttempt(t, id, 0, deadline)
}

// publishAttempt sends attempt n of a job, replies on their own subject.
func (f *fixture) publishAttempt(t *testing.T, id string, n uint32, deadline time.Time) *nats.Subscription {
	t.Helper()
	reply := fmt.Sprintf("sy.reply.test.%s-%d", id, n)
	sub, err := f.nc.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	job := &wire.Job{RequestId: id, Attempt: n, Model: "m", Api: wire.API_API_CHAT, Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`),
		ReplySubject: reply, Deadline: timestamppb.New(deadline)}
	data, _ := proto.Marshal(job)
	if _, err := f.js.Publish(context.Background(), "sy.jobs.m.regular", data); err != nil {
		t.Fatal(err)
	}
	return sub
}

func next(t *testing.T, sub *nats.Subscription) *wire.Chunk {
	t.Helper()
	c, err := nextFramed(t, sub, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// unread holds, per subscription, the chunks of reply messages read but
// not yet returned: an agent may frame several chunks into one message.
var unread sync.Map // *nats.Subscription -> []*wire.Chunk

// nextFramed returns the next chunk of the reply messages on sub, waiting
// at most wait for a message.
func nextFramed(t *testing.T, sub *nats.Subscription, wait time.Duration) (*wire.Chunk, error) {
	t.Helper()
	if v, ok := unread.Load(sub); ok {
		if cs := v.([]*wire.Chunk); len(cs) > 0 {
			unread.Store(sub, cs[1:])
			return cs[0], nil
		}
	}
	m, err := sub.NextMsg(wait)
	if err != nil {
		return nil, err
	}
	var cs []*wire.Chunk
	if err := wire.Frames(m.Data, func(b []byte) error {
		c := new(wire.Chunk)
		cs = append(cs, c)
		return proto.Unmarshal(b, c)
	}); err != nil || len(cs) == 0 {
		t.Fatalf("reply message %x: %d chunks, %v", m.Data, len(cs), err)
	}
	unread.Store(sub, cs[1:])
	return cs[0], nil
}

func TestChunkSequence(t *testing.T) {
	f := start(t, 2, 0)
	sub := f.publish(t, "r1", time.Now().Add(time.Minute))
	var kinds []wire.Chunk_Kind
	for i := uint64(0); ; i++ {
		c := next(t, sub)
		if c.GetSeq() != i || c.GetAgentId() != "a1" || c.GetRequestId() != "r1" {
			t.Fatalf("chunk %d: %v", i, c)
		}
		kinds = append(kinds, c.GetKind())
		if c.GetKind() == wire.Chunk_KIND_FINAL {
			if c.GetUsage().GetCompletionTokens() != 1 || c.GetFinishReason() != "stop" {
				t.Fatalf("final %v", c)
			}
			break
		}
	}
	want := []wire.Chunk_Kind{wire.Chunk_KIND_ACCEPTED, wire.Chunk_KIND_TOKEN, wire.Chunk_KIND_FINAL}
	if len(kinds) != len(want) {
		t.Fatalf("kinds %v", kinds)
	}
}

// TestExpiredJobNeverStarts: a job whose deadline passed is terminated with
// an error chunk and never reaches the engine.
func TestExpiredJobNeverStarts(t *testing.T) {
	f := start(t, 1, 0)
	sub := f.publish(t, "late", time.Now().Add(-time.Second))
	c := next(t, sub)
	if c.GetKind() != wire.Chunk_KIND_ERROR || c.GetError().GetCode() != wire.CodeDeadlineExceeded {
		t.Fatalf("got %v", c)
	}
	if n := f.eng.calls.Load(); n != 0 {
		t.Fatalf("engine called %d times for an expired job", n)
	}
}

// TestCancelledBeforePull: a cancel that arrives before the job is pulled
// keeps it from starting.
func TestCancelledBeforePull(t *testing.T) {
	f := start(t, 1, 300*time.Millisecond)
	busy := f.publish(t, "busy", time.Now().Add(time.Minute))
	if c := next(t, busy); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("got %v", c)
	}
	if err := f.nc.Publish("sy.cancel.doomed", nil); err != nil {
		t.Fatal(err)
	}
	_ = f.nc.Flush()
	// The cancel and the job reach the agent on different subscriptions,
	// each with its own goroutine: wait until the cancel is taken in.
	testwait.For(t, 10*time.Second, 2*time.Millisecond, func() error {
		if !f.agent.CancelRecorded("doomed") {
			return fmt.Errorf("cancel not taken in yet")
		}
		return nil
	})
	sub := f.publish(t, "doomed", time.Now().Add(time.Minute))
	after := f.publish(t, "after", time.Now().Add(time.Minute))
	for c := next(t, after); c.GetKind() != wire.Chunk_KIND_FINAL; c = next(t, after) {
	}
	if m, err := sub.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("the cancelled job spoke: %v", m)
	}
	if n := f.eng.calls.Load(); n != 2 {
		t.Fatalf("engine ran %d jobs, want 2 (busy, after)", n)
	}
}

// TestNeverAboveSlots: with many jobs queued, the engine never runs more at
// once than the agent's slots.
func TestNeverAboveSlots(t *testing.T) {
	f := start(t, 3, 20*time.Millisecond)
	var subs []*nats.Subscription
	for i := range 30 {
		subs = append(subs, f.publish(t, "j"+string(rune('a'+i)), time.Now().Add(time.Minute)))
	}
	for _, s := range subs {
		for c := next(t, s); c.GetKind() != wire.Chunk_KIND_FINAL; c = next(t, s) {
		}
	}
	if p := f.eng.peak.Load(); p > 3 || p < 2 {
		t.Fatalf("peak concurrency %d with 3 slots", p)
	}
}

// TestCancelEachAttempt: a stream migrated to the agent that already holds
// its previous attempt has two attempts of one request here at once; the
// old one ending must not make the new one unreachable by its cancel.
func TestCancelEachAttempt(t *testing.T) {
	f := start(t, 2, time.Minute)
	cancelUpTo := func(n uint32) {
		t.Helper()
		if err := f.nc.Publish("sy.cancel.m1", []byte(fmt.Sprint(n))); err != nil {
			t.Fatal(err)
		}
		_ = f.nc.Flush()
	}
	old := f.publishAttempt(t, "m1", 0, time.Now().Add(time.Minute))
	if c := next(t, old); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("got %v", c)
	}
	cur := f.publishAttempt(t, "m1", 1, time.Now().Add(time.Minute))
	if c := next(t, cur); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("got %v", c)
	}
	waitRunning := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for f.eng.now.Load() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d jobs at the engine, want %d", f.eng.now.Load(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitRunning(2)
	cancelUpTo(0) // the migration abandons attempt 0 only
	waitRunning(1)
	cancelUpTo(1) // the client goes away
	waitRunning(0)
}

// TestDrainTimeoutEndsJobs: past --drain-timeout a draining agent ends the
// job it still runs with a retryable draining error, which the broker
// repairs elsewhere, and Run returns.
func TestDrainTimeoutEndsJobs(t *testing.T) {
	f := start(t, 1, time.Minute, func(c *agent.Config) { c.DrainTimeout = 100 * time.Millisecond })
	sub := f.publish(t, "d1", time.Now().Add(time.Minute))
	if c := next(t, sub); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("got %v", c)
	}
	f.stop()
	c := next(t, sub)
	if c.GetKind() != wire.Chunk_KIND_ERROR || c.GetError().GetCode() != wire.CodeDraining || !c.GetError().GetRetryable() {
		t.Fatalf("got %v, want a retryable draining error", c)
	}
	select {
	case err := <-f.done:
		f.done <- err
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain timeout")
	}
	if n := f.eng.now.Load(); n != 0 {
		t.Fatalf("%d requests still at the engine", n)
	}
}

// A job with a secret (a broker that shares one reply subject among its
// requests) gets framed chunks that carry the secret back, and the chunks
// of concurrent requests may share one message; each attempt's sequence
// is whole and in order.
func TestFramedRepliesCarryTheSecret(t *testing.T) {
	f := start(t, 8, 0)
	const reply = "sy.reply.test.chunks"
	sub, err := f.nc.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	for i := range n {
		job := &wire.Job{RequestId: fmt.Sprintf("f%d", i), Model: "m", Api: wire.API_API_CHAT, Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`),
			ReplySubject: reply, Deadline: timestamppb.New(time.Now().Add(time.Minute)), Secret: uint64(1000 + i)}
		data, _ := proto.Marshal(job)
		if _, err := f.js.Publish(context.Background(), "sy.jobs.m.regular", data); err != nil {
			t.Fatal(err)
		}
	}
	nextSeq := map[string]uint64{}
	ended := 0
	for ended < n {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d requests ended: %v", ended, n, err)
		}
		if m.Data[0] != wire.FrameMarker {
			t.Fatalf("reply not framed: %x", m.Data[:min(8, len(m.Data))])
		}
		if err := wire.Frames(m.Data, func(b []byte) error {
			c := new(wire.Chunk)
			if err := proto.Unmarshal(b, c); err != nil {
				return err
			}
			var i int
			fmt.Sscanf(c.GetRequestId(), "f%d", &i)
			if c.GetSecret() != uint64(1000+i) {
				t.Errorf("%s: secret %d, want %d", c.GetRequestId(), c.GetSecret(), 1000+i)
			}
			if c.GetKind() == wire.Chunk_KIND_KEEPALIVE {
				return nil
			}
			if c.GetSeq() != nextSeq[c.GetRequestId()] {
				t.Errorf("%s: seq %d, want %d", c.GetRequestId(), c.GetSeq(), nextSeq[c.GetRequestId()])
			}
			nextSeq[c.GetRequestId()]++
			if c.GetKind() == wire.Chunk_KIND_FINAL || c.GetKind() == wire.Chunk_KIND_ERROR {
				ended++
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancelNamingAnAgent: when two agents run one attempt, the broker
// stops the one whose stream it does not relay with a cancel naming it;
// any other agent running that attempt ignores it.
func TestCancelNamingAnAgent(t *testing.T) {
	f := start(t, 1, time.Minute)
	sub := f.publish(t, "r", time.Now().Add(time.Minute))
	if c := next(t, sub); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("got %v", c)
	}
	testwait.For(t, 10*time.Second, 2*time.Millisecond, func() error {
		if f.eng.now.Load() != 1 {
			return fmt.Errorf("the job is not at the engine yet")
		}
		return nil
	})
	cancel := func(id string, data []byte) {
		t.Helper()
		if err := f.nc.Publish("sy.cancel."+id, data); err != nil {
			t.Fatal(err)
		}
		_ = f.nc.Flush()
	}
	cancel("r", wire.AppendCancel(nil, 0, "a2"))
	// Cancels are taken in order: once a later one is in, the first was
	// read and ignored.
	cancel("probe", nil)
	testwait.For(t, 10*time.Second, 2*time.Millisecond, func() error {
		if !f.agent.CancelRecorded("probe") {
			return fmt.Errorf("probe cancel not taken in yet")
		}
		return nil
	})
	if f.agent.CancelRecorded("r") || f.eng.now.Load() != 1 {
		t.Fatalf("a cancel naming another agent stopped this one's job (recorded %v, at the engine %d)", f.agent.CancelRecorded("r"), f.eng.now.Load())
	}
	cancel("r", wire.AppendCancel(nil, 0, "a1"))
	testwait.For(t, 10*time.Second, 2*time.Millisecond, func() error {
		if f.eng.now.Load() != 0 {
			return fmt.Errorf("the engine request still runs")
		}
		return nil
	})
}

// TestSecondCopyNotRun: two copies of one attempt pulled by one agent (an
// affinity offer and the shared copy the broker moved it to) run once:
// the broker could not tell the two runs of one agent apart to stop one.
func TestSecondCopyNotRun(t *testing.T) {
	f := start(t, 2, time.Minute)
	first := f.publish(t, "r", time.Now().Add(time.Minute))
	if c := next(t, first); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("got %v", c)
	}
	f.publish(t, "r", time.Now().Add(time.Minute))
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if err := f.streamEmpty(); err != nil {
			return err
		}
		// The second copy gave its slot back: it is not running.
		if n := f.agent.SlotsHeld(); n != 1 {
			return fmt.Errorf("%d slots held", n)
		}
		// The first speaks (accepted) before it calls its engine: on a
		// busy machine the call may come after the second copy is gone.
		if f.eng.calls.Load() == 0 {
			return errors.New("the first copy has not called its engine yet")
		}
		return nil
	})
	if n := f.eng.calls.Load(); n != 1 {
		t.Fatalf("engine ran the attempt %d times", n)
	}
	if err := f.nc.Publish("sy.cancel.r", nil); err != nil {
		t.Fatal(err)
	}
}

// TestCopyAfterEndNotRun: a copy of an attempt that ran here to its end
// (a job delivered again after the agent answered it) is not run again:
// its request is over, and nobody at the broker would hear it.
func TestCopyAfterEndNotRun(t *testing.T) {
	f := start(t, 2, 0)
	sub := f.publish(t, "r", time.Now().Add(time.Minute))
	for c := next(t, sub); c.GetKind() != wire.Chunk_KIND_FINAL; c = next(t, sub) {
	}
	again := f.publish(t, "r", time.Now().Add(time.Minute))
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if err := f.streamEmpty(); err != nil {
			return err
		}
		if n := f.agent.SlotsHeld(); n != 0 {
			return fmt.Errorf("%d slots held", n)
		}
		return nil
	})
	// A copy that ran would have spoken (accepted) before its ack, which
	// emptied the stream.
	if n, _, _ := again.Pending(); n != 0 || f.eng.calls.Load() != 1 {
		t.Fatalf("the copy spoke %d chunks; the engine ran the attempt %d times", n, f.eng.calls.Load())
	}
	// Another attempt of the request (a retry) runs.
	retry := f.publishAttempt(t, "r", 1, time.Now().Add(time.Minute))
	for c := next(t, retry); c.GetKind() != wire.Chunk_KIND_FINAL; c = next(t, retry) {
	}
	if n := f.eng.calls.Load(); n != 2 {
		t.Fatalf("engine calls %d after the retry, want 2", n)
	}
}

// streamEmpty reports an error while jobs are left in the stream.
func (f *fixture) streamEmpty() error {
	st, err := f.js.Stream(context.Background(), broker.DefaultStream)
	if err != nil {
		return err
	}
	info, err := st.Info(context.Background())
	if err != nil {
		return err
	}
	if info.State.Msgs != 0 {
		return fmt.Errorf("%d jobs still in the stream", info.State.Msgs)
	}
	return nil
}

// TestUndecodableJobDropped: a job that does not decode is taken off the
// queue (Term) without reaching the engine, and the agent goes on with
// the next.
func TestUndecodableJobDropped(t *testing.T) {
	f := start(t, 1, 0)
	good, _ := proto.Marshal(&wire.Job{RequestId: "bad", Model: "m", Body: []byte(`{"messages":[]}`)})
	if _, err := f.js.Publish(context.Background(), "sy.jobs.m.regular", good[:len(good)-1]); err != nil {
		t.Fatal(err)
	}
	sub := f.publish(t, "r1", time.Now().Add(time.Minute))
	for c := next(t, sub); c.GetKind() != wire.Chunk_KIND_FINAL; c = next(t, sub) {
		if c.GetKind() == wire.Chunk_KIND_ERROR {
			t.Fatalf("got %v", c)
		}
	}
	testwait.For(t, 10*time.Second, 5*time.Millisecond, f.streamEmpty)
	if n := f.eng.calls.Load(); n != 1 {
		t.Fatalf("engine called %d times", n)
	}
}

// TestPullAfterConsumerDeleted: the pool's consumer deleted under a
// waiting pull (a stream recreated, an operator's mistake): the pull loop
// is told so (409 Consumer Deleted, or no responders for the next pull),
// binds the consumer again, and a job published afterwards runs.
func TestPullAfterConsumerDeleted(t *testing.T) {
	f := start(t, 2, 0)
	ctx := context.Background()
	sub := f.publish(t, "before", time.Now().Add(time.Minute))
	for c := next(t, sub); c.GetKind() != wire.Chunk_KIND_FINAL; c = next(t, sub) {
	}
	st, err := f.js.Stream(ctx, broker.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	names := st.ConsumerNames(ctx)
	var deleted int
	for name := range names.Name() {
		if err := st.DeleteConsumer(ctx, name); err != nil {
			t.Fatal(err)
		}
		deleted++
	}
	if deleted == 0 {
		t.Fatal("no consumer to delete")
	}
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n, _ := st.Info(ctx); n == nil || n.State.Consumers == 0 {
			return errors.New("consumer not bound again yet")
		}
		return nil
	})
	sub = f.publish(t, "after", time.Now().Add(time.Minute))
	for c := next(t, sub); c.GetKind() != wire.Chunk_KIND_FINAL; c = next(t, sub) {
	}
	if n := f.eng.calls.Load(); n != 2 {
		t.Fatalf("engine ran %d jobs, want 2", n)
	}
}
