package agent_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// orderEngine records the order requests reach it and holds each for
// delay, or until the test releases it (hold).
type orderEngine struct {
	delay time.Duration
	hold  chan struct{}
	mu    sync.Mutex
	order []string
	now   int
	peak  int
}

func (e *orderEngine) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	e.mu.Lock()
	e.order = append(e.order, r.RequestID)
	e.now++
	e.peak = max(e.peak, e.now)
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.now--
		e.mu.Unlock()
	}()
	var wait <-chan time.Time
	if e.delay > 0 {
		wait = time.After(e.delay)
	}
	select {
	case <-wait:
	case <-e.hold:
	case <-ctx.Done():
		return ctx.Err()
	}
	return emit([]byte(`{"id":"x","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":"stop"}]}`), false)
}

func (e *orderEngine) started() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.order...)
}

type classFixture struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	eng   *orderEngine
	agent *agent.Agent
}

func startClass(t *testing.T, eng *orderEngine, cfg agent.Config) *classFixture {
	t.Helper()
	nc, anc := jobsServer(t)
	cfg.ID, cfg.Model, cfg.Heartbeat, cfg.PullWait = "a1", "m", 50*time.Millisecond, 200*time.Millisecond
	a, err := agent.New(anc, eng, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		close(eng.hold)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent returned %v", err)
		}
	})
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := a.State(); st != wire.StateReady {
			return fmt.Errorf("agent is %s", st)
		}
		return nil
	})
	js, _ := jetstream.New(nc)
	return &classFixture{nc: nc, js: js, eng: eng, agent: a}
}

// publish queues job id on the interactive queue, or with batch on the
// batch queue as a preemptible batch job, and returns its replies.
func (f *classFixture) publish(t *testing.T, id string, batch bool) *nats.Subscription {
	t.Helper()
	reply := "sy.reply.test." + id
	sub, err := f.nc.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	job := &wire.Job{RequestId: id, Model: "m", Api: wire.API_API_CHAT, Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`),
		ReplySubject: reply, Deadline: timestamppb.New(time.Now().Add(time.Minute)), Batch: batch, Preemptible: batch}
	data, _ := proto.Marshal(job)
	subject := "sy.jobs.m.regular"
	if batch {
		subject = "sy.jobs.m.batch.regular"
	}
	if _, err := f.js.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
	return sub
}

// untilEnd reads a job's chunks to its final or error chunk.
func untilEnd(t *testing.T, sub *nats.Subscription) *wire.Chunk {
	t.Helper()
	for {
		c := next(t, sub)
		if k := c.GetKind(); k == wire.Chunk_KIND_FINAL || k == wire.Chunk_KIND_ERROR {
			return c
		}
	}
}

func nextEnd(t *testing.T, sub *nats.Subscription) (*wire.Chunk, error) {
	t.Helper()
	for {
		c, err := nextFramed(t, sub, 10*time.Second)
		if err != nil {
			return nil, err
		}
		if k := c.GetKind(); k == wire.Chunk_KIND_FINAL || k == wire.Chunk_KIND_ERROR {
			return c, nil
		}
	}
}

// TestBatchLeavesTheReserve: batch jobs alone take every slot but the
// reserve, never more than BatchMax, the heartbeat counts them in
// batch_active, and each runs once to its end.
func TestBatchLeavesTheReserve(t *testing.T) {
	for _, tc := range []struct {
		name             string
		slots, res, bmax int
		want             int
	}{
		{"reserve", 4, 1, 0, 3},
		{"max", 4, 0, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := &orderEngine{delay: 150 * time.Millisecond, hold: make(chan struct{})}
			f := startClass(t, eng, agent.Config{Slots: tc.slots, BatchReserve: tc.res, BatchMax: tc.bmax})
			var subs []*nats.Subscription
			for i := range 12 {
				subs = append(subs, f.publish(t, fmt.Sprintf("b%d", i), true))
			}
			sawBatch := false
			testwait.For(t, 10*time.Second, time.Millisecond, func() error {
				if n := f.agent.Heartbeat().GetBatchActive(); int(n) == tc.want {
					sawBatch = true
				}
				if !sawBatch {
					return fmt.Errorf("batch_active never reached %d", tc.want)
				}
				return nil
			})
			for i, sub := range subs {
				if c := untilEnd(t, sub); c.GetKind() != wire.Chunk_KIND_FINAL {
					t.Fatalf("b%d ended with %v", i, c)
				}
			}
			eng.mu.Lock()
			peak := eng.peak
			eng.mu.Unlock()
			if peak != tc.want {
				t.Fatalf("%d batch jobs at once, want %d", peak, tc.want)
			}
			if got := eng.started(); len(got) != 12 {
				t.Fatalf("engine ran %d jobs: %v", len(got), got)
			}
		})
	}
}

// TestInteractiveFirst: with a slot free and both queues full, the agent
// runs every interactive job before any batch job, although the batch
// jobs were queued first.
func TestInteractiveFirst(t *testing.T) {
	eng := &orderEngine{hold: make(chan struct{})}
	// A generous gate: the interactive pull has time to be handed a job
	// on a loaded machine before the queue counts as empty.
	f := startClass(t, eng, agent.Config{Slots: 1, BatchIdleGate: 300 * time.Millisecond, NoBatchPreempt: true})
	first := f.publish(t, "i0", false)
	if c := next(t, first); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("i0: %v", c)
	}
	var subs []*nats.Subscription
	for i := range 3 {
		subs = append(subs, f.publish(t, fmt.Sprintf("b%d", i), true))
	}
	for i := 1; i <= 3; i++ {
		subs = append(subs, f.publish(t, fmt.Sprintf("i%d", i), false))
	}
	// Each job holds the slot until released, one at a time.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for range 7 {
			select {
			case eng.hold <- struct{}{}:
			case <-stop:
				return
			}
		}
	}()
	untilEnd(t, first)
	for i, sub := range subs {
		c, err := nextEnd(t, sub)
		if err != nil || c.GetKind() != wire.Chunk_KIND_FINAL {
			t.Fatalf("job %d ended with %v, %v; engine order %v", i, c, err, eng.started())
		}
	}
	got := eng.started()
	want := []string{"i0", "i1", "i2", "i3"}
	if len(got) != 7 || fmt.Sprint(got[:4]) != fmt.Sprint(want) {
		t.Fatalf("engine order %v, want %v first, then the batch jobs", got, want)
	}
}

// TestInteractivePreemptsBatch: on a full agent an interactive job starts
// at once; the newest batch job ends with a retryable preempted error
// (the broker runs it again) and the other runs on.
func TestInteractivePreemptsBatch(t *testing.T) {
	eng := &orderEngine{hold: make(chan struct{})}
	f := startClass(t, eng, agent.Config{Slots: 2})
	b0 := f.publish(t, "b0", true)
	if c := next(t, b0); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("b0: %v", c)
	}
	b1 := f.publish(t, "b1", true)
	if c := next(t, b1); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("b1: %v", c)
	}
	if n := f.agent.Heartbeat().GetBatchActive(); n != 2 {
		t.Fatalf("batch_active %d, want 2", n)
	}
	i0 := f.publish(t, "i0", false)
	if c := next(t, i0); c.GetKind() != wire.Chunk_KIND_ACCEPTED {
		t.Fatalf("i0: %v", c)
	}
	c := next(t, b1)
	if c.GetKind() != wire.Chunk_KIND_ERROR || c.GetError().GetCode() != wire.CodePreempted || !c.GetError().GetRetryable() {
		t.Fatalf("b1 got %v, want a retryable preempted error", c)
	}
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		hb := f.agent.Heartbeat()
		if hb.GetActive() != 2 || hb.GetBatchActive() != 1 {
			return fmt.Errorf("heartbeat active %d batch_active %d, want 2 and 1", hb.GetActive(), hb.GetBatchActive())
		}
		return nil
	})
	if _, err := nextFramed(t, b0, 200*time.Millisecond); err == nil {
		t.Fatal("b0 spoke: it should run on")
	}
}
