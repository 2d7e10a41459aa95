package broker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-ai/switchyard/internal/natstest"
)

// publishRig is a broker that is not running, for its publishes alone.
func publishRig(t testing.TB) (*Broker, jetstream.JetStream) {
	t.Helper()
	return publishRigWith(t, Config{})
}

// publishRigWith is publishRig with the broker's configuration.
func publishRigWith(t testing.TB, cfg Config) (*Broker, jetstream.JetStream) {
	t.Helper()
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	b, err := New(nc, cfg, WithLogger(slog.New(slog.DiscardHandler)), WithPublishTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return b, js
}

func jobsStream(t testing.TB, js jetstream.JetStream, perSubject int64) {
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
		before := publishRetries(t, b)
		_, err := b.publishJob(context.Background(), "sy.jobs.m.regular", []byte("job"), jobMsgID("r2", 0), time.Now().Add(5*time.Second))
		if !errors.Is(publishError("sy.jobs.m.regular", err), ErrQueueFull) {
			t.Fatalf("error %v, want ErrQueueFull", err)
		}
		if n := publishRetries(t, b); n != before {
			t.Fatalf("a full queue was tried again %v times: it is an answer", n-before)
		}
	})
}

// publishRetries is the broker's count of publish tries that NATS could
// not take now.
func publishRetries(t *testing.T, b *Broker) float64 {
	t.Helper()
	var m dto.Metric
	if err := b.metrics.publishRetries.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// callRig is publishRig with a call to publish for.
func callRig(t testing.TB, id string) (*Broker, jetstream.JetStream, *Call) {
	t.Helper()
	b, js := publishRig(t)
	c := &Call{ID: id, b: b, ready: make(chan struct{}, 1), Deadline: time.Now().Add(time.Minute)}
	return b, js, c
}

// TestCallPublish: an attempt's job is stored once whatever the tries (its
// message id), the next attempt is a new job.
func TestCallPublish(t *testing.T) {
	_, js, c := callRig(t, "r1")
	jobsStream(t, js, 10)
	seq, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 0)
	if err != nil || seq == 0 {
		t.Fatalf("publish: seq %d, %v", seq, err)
	}
	again, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 0)
	if err != nil || again != seq {
		t.Fatalf("the same attempt again: seq %d, %v, want %d", again, err, seq)
	}
	next, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 1)
	if err != nil || next == seq {
		t.Fatalf("the next attempt: seq %d, %v, want a new job", next, err)
	}
	st, err := js.Stream(context.Background(), DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := st.Info(context.Background()); info.State.Msgs != 2 {
		t.Fatalf("%d jobs stored, want 2", info.State.Msgs)
	}
}

// TestCallPublishOutcomes: a stream that is not there yet is waited for
// (and the job stored once), a full queue is a 429 at once, a client gone
// ends it.
func TestCallPublishOutcomes(t *testing.T) {
	t.Run("no stream yet", func(t *testing.T) {
		_, js, c := callRig(t, "r1")
		go func() {
			time.Sleep(300 * time.Millisecond)
			jobsStream(t, js, 10)
		}()
		seq, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 0)
		if err != nil || seq != 1 {
			t.Fatalf("publish: seq %d, %v, want the stream's first job", seq, err)
		}
	})
	t.Run("queue full", func(t *testing.T) {
		b, js, c := callRig(t, "r1")
		jobsStream(t, js, 1)
		if _, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 0); err != nil {
			t.Fatal(err)
		}
		before := publishRetries(t, b)
		_, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 1)
		if !errors.Is(publishError("sy.jobs.m.regular", err), ErrQueueFull) {
			t.Fatalf("error %v, want ErrQueueFull", err)
		}
		if n := publishRetries(t, b); n != before {
			t.Fatalf("a full queue was tried again %v times: it is an answer", n-before)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		_, _, c := callRig(t, "r1")
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		if _, err := c.publish(ctx, "sy.jobs.m.regular", []byte("job"), 0); !errors.Is(err, context.Canceled) {
			t.Fatalf("publish without a stream after the client left: %v, want context.Canceled", err)
		}
	})
	t.Run("connection closed", func(t *testing.T) {
		b, _, c := callRig(t, "r1")
		b.nc.Close()
		_, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 0)
		if !errors.Is(publishError("sy.jobs.m.regular", err), ErrNotConnected) {
			t.Fatalf("error %v, want ErrNotConnected", err)
		}
	})
}

// BenchmarkPublish is a job's publish through JetStream (Call.publish), on
// an embedded server in this process: cpu-ns/op is the process's CPU
// (client and server) per job.
func BenchmarkPublish(b *testing.B) {
	_, js, c := callRig(b, "r1")
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: DefaultStream, Subjects: []string{"sy.jobs.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage,
	}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 1200)
	ctx := context.Background()
	b.ReportAllocs()
	cpu0 := processCPU()
	var i uint32
	for b.Loop() {
		if _, err := c.publish(ctx, "sy.jobs.m.regular", data, i); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestStreamDuplicateWindow: the jobs stream remembers a job's message id
// for as long as a publish of it may be tried again (the broker's publish
// wait, a prefill agent's KV hold, and the last try's timeout), not for
// JetStream's default two minutes; never longer than the stream keeps
// jobs. Within the window a second store of one id is a duplicate.
func TestStreamDuplicateWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want time.Duration
	}{
		{"defaults", Config{}, DefaultKVHold + 2*200*time.Millisecond},
		{"publish wait longer than the KV hold", Config{PublishWait: time.Minute, KVHold: 5 * time.Second}, time.Minute + 2*200*time.Millisecond},
		{"bounded by the jobs' age", Config{PublishWait: 10 * time.Minute, RequestTimeout: time.Second}, time.Second + time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, js := publishRigWith(t, tc.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := b.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, b.cfg.Stream)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.CachedInfo().Config.Duplicates; got != tc.want {
				t.Fatalf("duplicate window %s, want %s", got, tc.want)
			}
			subject, err := b.subj.Jobs("m", "regular")
			if err != nil {
				t.Fatal(err)
			}
			first, err := b.publishJob(ctx, subject, []byte("job"), jobMsgID("r1", 0), time.Now().Add(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			again, err := b.publishJob(ctx, subject, []byte("job"), jobMsgID("r1", 0), time.Now().Add(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if !again.Duplicate || again.Sequence != first.Sequence {
				t.Fatalf("second store of one id: %+v, want a duplicate of %d", again, first.Sequence)
			}
		})
	}
}

// A request id is the broker's id, a counter and a random tail; ids do not
// repeat.
func TestNewRequestID(t *testing.T) {
	b := &Broker{cfg: Config{ID: "b7"}}
	seen := map[string]bool{}
	for range 1000 {
		id := b.newRequestID()
		rest, ok := strings.CutPrefix(id, "b7-")
		if !ok || len(rest) < 7 || seen[id] {
			t.Fatalf("id %q", id)
		}
		for _, r := range rest {
			if !strings.ContainsRune(idAlphabet, r) {
				t.Fatalf("id %q has %q", id, r)
			}
		}
		seen[id] = true
	}
}

// BenchmarkNewRequestID: a request id is made in one allocation.
func BenchmarkNewRequestID(b *testing.B) {
	br := &Broker{cfg: Config{ID: "b7"}}
	b.ReportAllocs()
	for b.Loop() {
		_ = br.newRequestID()
	}
}
