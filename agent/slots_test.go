package agent_test

import (
	"context"
	"fmt"
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
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// heldEngine holds every request until the test releases one, and counts
// the requests it holds, the most at once, and those it answered.
type heldEngine struct {
	release            chan struct{}
	now, peak, answers atomic.Int32
}

func (e *heldEngine) Stream(ctx context.Context, _ *agent.Request, emit agent.Emit) error {
	n := e.now.Add(1)
	for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
	}
	defer e.now.Add(-1)
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.answers.Add(1)
	return emit([]byte(`{"id":"x","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":"stop"}]}`), false)
}

// TestHoldsNoMoreThanSlots: an agent of N slots under a deep queue (its
// pool's shared one, and its directed one beside it) holds at most N jobs
// delivered and unfinished at any time, as the jobs' ends free its slots
// one by one; and with its shared queue alone, JetStream never hands it
// more than N (what it took off the queue and what waits for its ack).
func TestHoldsNoMoreThanSlots(t *testing.T) {
	const slots, queued, released = 4, 200, 24
	for _, tc := range []struct {
		name     string
		directed bool
	}{
		{"shared queue", false},
		{"shared and directed queues", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
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
			if err := b.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			subj := subjects.Must("sy")
			shared, err := subj.Jobs("m", subjects.PoolRegular)
			if err != nil {
				t.Fatal(err)
			}
			directed, err := subj.Directed("m", subjects.PoolRegular, "", "a1")
			if err != nil {
				t.Fatal(err)
			}
			for i := range queued {
				to := shared
				if tc.directed && i%2 == 1 {
					to = directed
				}
				job := &wire.Job{RequestId: fmt.Sprintf("r%d", i), Model: "m", Api: wire.API_API_CHAT,
					Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`), ReplySubject: "sy.reply.test.chunks",
					Deadline: timestamppb.New(time.Now().Add(time.Minute))}
				data, err := proto.Marshal(job)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := js.Publish(ctx, to, data); err != nil {
					t.Fatal(err)
				}
			}

			anc, err := nats.Connect(s.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(anc.Close)
			eng := &heldEngine{release: make(chan struct{})}
			a, err := agent.New(anc, eng, agent.Config{ID: "a1", Model: "m", Slots: slots, NoDirected: !tc.directed,
				Heartbeat: 50 * time.Millisecond, PullWait: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(runCtx) }()
			t.Cleanup(func() {
				stop()
				close(eng.release) // let the held jobs end: the agent drains
				if err := <-done; err != nil {
					t.Errorf("agent returned %v", err)
				}
			})
			st, err := js.Stream(ctx, broker.DefaultStream)
			if err != nil {
				t.Fatal(err)
			}
			// handedOut is what JetStream counts as the agent's: taken off
			// the work queue (acked) or delivered and waiting for its ack.
			handedOut := func() int {
				info, err := st.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				n := queued - int(info.State.Msgs)
				for names := st.ConsumerNames(ctx); ; {
					name, ok := <-names.Name()
					if !ok {
						break
					}
					c, err := st.Consumer(ctx, name)
					if err != nil {
						continue // an inactive directed consumer gone meanwhile
					}
					n += c.CachedInfo().NumAckPending
				}
				return n
			}
			check := func() {
				t.Helper()
				if n := eng.now.Load(); n > slots {
					t.Fatalf("the engine holds %d jobs, the agent has %d slots", n, slots)
				}
				if n := a.SlotsHeld(); n > slots {
					t.Fatalf("the agent holds %d jobs in its slots, has %d", n, slots)
				}
				if n := a.Active(); n > slots {
					t.Fatalf("the agent runs %d jobs, has %d slots", n, slots)
				}
				if !tc.directed {
					if n := handedOut(); n > slots+int(eng.answers.Load()) {
						t.Fatalf("JetStream handed the agent %d jobs, %d answered, with %d slots", n, eng.answers.Load(), slots)
					}
				}
			}
			// Full: the agent holds its slots and asks for nothing more,
			// over several pull expiries.
			testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
				if n := eng.now.Load(); n != slots {
					return fmt.Errorf("the engine holds %d jobs, want %d", n, slots)
				}
				return nil
			})
			poll := time.NewTicker(5 * time.Millisecond)
			defer poll.Stop()
			for range 100 { // several pull expiries
				<-poll.C
				check()
			}
			// Jobs end one at a time; each freed slot is filled again, never
			// past the limit.
			for i := range released {
				eng.release <- struct{}{}
				check()
				testwait.For(t, 10*time.Second, time.Millisecond, func() error {
					check()
					if n := eng.now.Load(); n != slots {
						return fmt.Errorf("after %d jobs ended the engine holds %d, want %d", i+1, n, slots)
					}
					return nil
				})
			}
			if p := eng.peak.Load(); p != slots {
				t.Fatalf("the engine held at most %d jobs at once, want %d", p, slots)
			}
		})
	}
}
