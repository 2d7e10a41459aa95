package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/alloctest"
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
	return publishRigWith(t, Config{})
}

// publishRigWith is publishRig with the broker's configuration.
func publishRigWith(t *testing.T, cfg Config) (*Broker, jetstream.JetStream) {
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

// ackRig is publishRig with the broker's ack subscription, as Run makes
// it, and a call to publish for.
func ackRig(t *testing.T, id string) (*Broker, jetstream.JetStream, *Call) {
	t.Helper()
	b, js := publishRig(t)
	sub, err := b.nc.Subscribe(b.ackPrefix+"*.*", b.onAck)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	c := &Call{ID: id, b: b, ready: make(chan struct{}, 1), Deadline: time.Now().Add(time.Minute)}
	b.calls.Store(id, c)
	return b, js, c
}

// TestPublishOnce: a job's publish is one message whose ack comes to the
// broker's ack subscription; the same attempt again is the same job (the
// message id), the next attempt a new one.
func TestPublishOnce(t *testing.T) {
	b, js, c := ackRig(t, "r1")
	jobsStream(t, js, 10)
	acks, err := b.nc.SubscribeSync(b.ackPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	seq, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 0)
	if err != nil || seq == 0 {
		t.Fatalf("publish: seq %d, %v", seq, err)
	}
	if m, err := acks.NextMsg(time.Second); err != nil || m.Subject != b.ackPrefix+"r1.0" {
		t.Fatalf("ack on %v (%v), want it on the broker's ack subject of r1's attempt 0", m, err)
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

// TestPublishOnceAllocs: a job's publish makes its ack subject (which
// holds its message id) and nats.go's header bytes; its message and
// header live in the call. What the server and nats.go's reader make for
// the ack, on their own goroutines, is not counted (see alloctest).
func TestPublishOnceAllocs(t *testing.T) {
	_, js, c := ackRig(t, "r1")
	jobsStream(t, js, 10)
	ctx := context.Background()
	publish := func() {
		if _, err := c.publish(ctx, "sy.jobs.m.regular", []byte("job"), 0); err != nil {
			t.Fatal(err)
		}
	}
	publish()
	allocs := alloctest.PerRun(t, 200, publish)
	t.Logf("a job's publish and its ack: %.1f allocations", allocs)
	// 3 here: the ack subject and nats.go's header bytes (two); three
	// more with a message, header and id made per publish.
	want := 3.0
	if alloctest.Race {
		want = 5 // the race detector moves values to the heap: 4
	}
	if allocs > want {
		t.Fatalf("a job's publish and its ack: %.1f allocations, want at most %.0f", allocs, want)
	}
}

// TestPublishOnceFallsBack: what the one try cannot settle is
// publishJob's: a stream that is not there yet is waited for (and the job
// stored once), a full queue is a 429 at once, a client gone ends it.
func TestPublishOnceFallsBack(t *testing.T) {
	t.Run("no stream yet", func(t *testing.T) {
		_, js, c := ackRig(t, "r1")
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
		_, js, c := ackRig(t, "r1")
		jobsStream(t, js, 1)
		if _, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 0); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := c.publish(context.Background(), "sy.jobs.m.regular", []byte("job"), 1)
		if !errors.Is(publishError("sy.jobs.m.regular", err), ErrQueueFull) {
			t.Fatalf("error %v, want ErrQueueFull", err)
		}
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("a full queue answered after %s", waited)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		_, _, c := ackRig(t, "r1")
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		if _, err := c.publish(ctx, "sy.jobs.m.regular", []byte("job"), 0); err == nil {
			t.Fatal("published without a stream")
		}
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("gave up %s after the client left", waited)
		}
	})
}

// TestOnAckOnlyWaitingAttempt: an ack for an attempt nobody waits for (a
// try given up, an abandoned attempt) changes nothing.
func TestOnAckOnlyWaitingAttempt(t *testing.T) {
	b, _, c := ackRig(t, "r1")
	ack := func(attempt string) {
		b.onAck(&nats.Msg{Subject: b.ackPrefix + "r1." + attempt, Data: []byte(`{"stream":"S","seq":7}`)})
	}
	ack("0")
	if c.ack.done {
		t.Fatal("an ack nobody waited for was taken")
	}
	c.ack = pubAckState{attempt: 2, waiting: true}
	ack("1")
	if c.ack.done {
		t.Fatal("an earlier attempt's ack was taken")
	}
	ack("2")
	if !c.ack.done || !c.ack.ok || c.ack.seq != 7 {
		t.Fatalf("ack state %+v, want seq 7", c.ack)
	}
	b.onAck(&nats.Msg{Subject: b.ackPrefix + "nobody.0", Data: []byte(`{"stream":"S","seq":7}`)})
}

func TestParsePubAck(t *testing.T) {
	for _, tc := range []struct {
		data   string
		status string
		seq    uint64
		ok     bool
	}{
		{`{"stream":"SWITCHYARD_JOBS","seq":42}`, "", 42, true},
		{`{"stream":"S","seq":9,"duplicate":true}`, "", 9, true},
		{`{"stream":"S","domain":"hub","seq":18446744073709551}`, "", 18446744073709551, true},
		{`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"S","seq":0}`, "", 0, false},
		{`{"stream":"S","seq":0}`, "", 0, false},
		{`{"stream":"S"}`, "", 0, false},
		{`{"stream":"S","seq":"1"}`, "", 0, false},
		{`{"stream":"S","seq":99999999999999999999}`, "", 0, false},
		{``, "503", 0, false},
	} {
		m := &nats.Msg{Data: []byte(tc.data)}
		if tc.status != "" {
			m.Header = nats.Header{"Status": []string{tc.status}}
		}
		if seq, ok := parsePubAck(m); seq != tc.seq || ok != tc.ok {
			t.Errorf("parsePubAck(%s) = %d, %v; want %d, %v", tc.data, seq, ok, tc.seq, tc.ok)
		}
	}
}

// BenchmarkPublish compares a job's publish through the JetStream client
// (publishJob) with the one try whose ack comes to the broker's own
// subscription (Call.publish), on an embedded server in this process:
// cpu-ns/op is the process's CPU (client and server) per job.
func BenchmarkPublish(b *testing.B) {
	for _, path := range []string{"publishJob", "publishOnce"} {
		b.Run(path, func(b *testing.B) {
			t := &testing.T{}
			br, js, c := ackRig(t, "r1")
			if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
				Name: DefaultStream, Subjects: []string{"sy.jobs.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage,
			}); err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 1200)
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for i := range b.N {
				var err error
				if path == "publishJob" {
					_, err = br.publishJob(ctx, "sy.jobs.m.regular", data, jobMsgID("r1", uint32(i)), time.Now().Add(time.Minute))
				} else {
					_, err = c.publish(ctx, "sy.jobs.m.regular", data, uint32(i))
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
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

// A request id is the broker's id, a counter and a random tail, made in
// one allocation; ids do not repeat.
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
	want := 1.0
	if alloctest.Race {
		want = 2 // the id's buffer escapes under the race detector
	}
	if n := testing.AllocsPerRun(100, func() { _ = b.newRequestID() }); n > want {
		t.Fatalf("a request id: %.1f allocations, want %.0f", n, want)
	}
}
