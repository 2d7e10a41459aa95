package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/natstest"
)

func TestNotNow(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no responders", nats.ErrNoResponders, true},
		{"no stream response", jetstream.ErrNoStreamResponse, true},
		{"timeout", nats.ErrTimeout, true},
		{"try deadline", fmt.Errorf("publish: %w", context.DeadlineExceeded), true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"leader election", fmt.Errorf("nats: %w", &jetstream.APIError{ErrorCode: jsClusterNotAvail, Code: 503}), true},
		{"queue full", fmt.Errorf("nats: %w", &jetstream.APIError{ErrorCode: jsStoreFailed, Code: 503, Description: "maximum messages per subject exceeded"}), false},
		{"other API error", &jetstream.APIError{ErrorCode: 10059, Code: 404}, false},
		{"client gone", context.Canceled, false},
		{"other", errors.New("boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := notNow(tc.err); got != tc.want {
				t.Fatalf("notNow(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// publishRig is a broker that is not running, for its publishes alone.
func publishRig(t *testing.T) (*Broker, jetstream.JetStream) {
	t.Helper()
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	b, err := New(nc, Config{}, WithLogger(slog.New(slog.DiscardHandler)), WithPublishTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return b, js
}

func jobsStream(t *testing.T, js jetstream.JetStream, perSubject int64) {
	t.Helper()
	_, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: DefaultStream, Subjects: []string{"sy.jobs.>"}, Retention: jetstream.WorkQueuePolicy,
		Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, MaxMsgsPerSubject: perSubject, Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPublishJobWaitsForStream: a publish that finds no stream to answer
// (as while a cluster elects the stream's leader) is tried again until the
// stream answers; the same attempt published again is not stored twice.
func TestPublishJobWaitsForStream(t *testing.T) {
	b, js := publishRig(t)
	go func() {
		time.Sleep(300 * time.Millisecond)
		jobsStream(t, js, 10)
	}()
	start := time.Now()
	ack, err := b.publishJob(context.Background(), "sy.jobs.m.regular", []byte("job"), jobMsgID("r1", 0), time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("published after %s, before the stream existed", waited)
	}
	again, err := b.publishJob(context.Background(), "sy.jobs.m.regular", []byte("job"), jobMsgID("r1", 0), time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.Sequence != ack.Sequence {
		t.Fatalf("second publish of one attempt: %+v, want a duplicate of seq %d", again, ack.Sequence)
	}
	next, err := b.publishJob(context.Background(), "sy.jobs.m.regular", []byte("job"), jobMsgID("r1", 1), time.Now().Add(5*time.Second))
	if err != nil || next.Duplicate {
		t.Fatalf("the next attempt: %+v %v, want a new job", next, err)
	}
}

// TestPublishJobBounds: a full queue is answered at once (429, never a
// wait); a stream that never answers is given up at the bound (503).
func TestPublishJobBounds(t *testing.T) {
	b, js := publishRig(t)
	t.Run("no stream", func(t *testing.T) {
		start := time.Now()
		_, err := b.publishJob(context.Background(), "sy.jobs.m.regular", []byte("job"), jobMsgID("r0", 0), time.Now().Add(500*time.Millisecond))
		if err == nil {
			t.Fatal("published without a stream")
		}
		if waited := time.Since(start); waited < 400*time.Millisecond || waited > 3*time.Second {
			t.Fatalf("gave up after %s, want about the 500ms bound", waited)
		}
		if !errors.Is(publishError("sy.jobs.m.regular", err), ErrNotConnected) {
			t.Fatalf("error %v, want ErrNotConnected", err)
		}
	})
	t.Run("queue full", func(t *testing.T) {
		jobsStream(t, js, 1)
		if _, err := b.publishJob(context.Background(), "sy.jobs.m.regular", []byte("job"), jobMsgID("r1", 0), time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := b.publishJob(context.Background(), "sy.jobs.m.regular", []byte("job"), jobMsgID("r2", 0), time.Now().Add(5*time.Second))
		if !errors.Is(publishError("sy.jobs.m.regular", err), ErrQueueFull) {
			t.Fatalf("error %v, want ErrQueueFull", err)
		}
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("a full queue answered after %s: it must not be retried", waited)
		}
	})
}
