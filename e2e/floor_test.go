package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/natstest"
)

// BenchmarkNATSFloor measures what the design's two NATS hops cost on
// their own, with nothing of Switchyard around them, in the shape the
// broker and agents use: a job published to a memory work-queue stream
// (the publisher on an in-process connection, as the broker's) and
// delivered to a TCP client's waiting pull request (as an agent's), and a
// core NATS message back from that client to the publisher's subscription
// (a reply chunk). One job at a time, so the figures are the path's
// latency, not queueing; "agent-process" runs the client in a process of
// its own, as a real agent is, "same-process" in the benchmark's. This is
// the floor under the broker's added TTFT: both hops are in every first
// token.
//
//	go test -run '^$' -bench NATSFloor -benchtime 300x ./e2e
func BenchmarkNATSFloor(b *testing.B) {
	for _, bc := range []struct {
		name  string
		child bool
		gap   time.Duration
	}{
		{"same-process", false, 0},
		{"agent-process", true, 0},
		// A pause before each job, as a stream's 5 ms between tokens or
		// a fleet's quiet second between requests: how much waking an
		// idle process costs on this machine.
		{"agent-process-idle-5ms", true, 5 * time.Millisecond},
		{"agent-process-idle-80ms", true, 80 * time.Millisecond},
	} {
		b.Run(bc.name, func(b *testing.B) { natsFloor(b, bc.child, bc.gap) })
	}
}

func natsFloor(b *testing.B, child bool, gap time.Duration) {
	s := natstest.RunServer(b, natstest.DefaultOptions(b))
	pub, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	ctx := context.Background()
	js, _ := jetstream.New(pub)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "JOBS", Subjects: []string{"jobs.>"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.MemoryStorage, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
		MaxMsgsPerSubject: 1024, MaxAge: 6 * time.Minute,
	}); err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "JOBS", jetstream.ConsumerConfig{
		Durable: "w", FilterSubject: "jobs.m.regular", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: -1,
		AckWait: 30 * time.Second, MaxWaiting: 4096,
	}); err != nil {
		b.Fatal(err)
	}
	type hop struct{ job, reply time.Duration }
	hops := make(chan hop, 1)
	ready := make(chan struct{}, 1)
	rs, err := pub.Subscribe("reply.b.r", func(m *nats.Msg) {
		back := time.Now()
		f := strings.Fields(string(m.Data))
		if len(f) != 3 {
			ready <- struct{}{} // the agent's first message: its pull request is out
			return
		}
		var t [3]int64
		for i := range f {
			t[i], _ = strconv.ParseInt(f[i], 10, 64)
		}
		hops <- hop{job: time.Duration(t[1] - t[0]), reply: back.Sub(time.Unix(0, t[2]))}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Unsubscribe()
	if err := pub.Flush(); err != nil {
		b.Fatal(err)
	}
	stop := func() {}
	if child {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFloorAgentProcess$")
		cmd.Env = append(os.Environ(), "SWITCHYARD_FLOOR_AGENT="+s.ClientURL())
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	} else {
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- floorAgent(actx, s.ClientURL()) }()
		stop = func() { cancel(); <-done }
	}
	defer stop()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		b.Fatal("floor agent did not start")
	}
	var job, reply []time.Duration
	b.ResetTimer()
	for range b.N {
		if gap > 0 {
			time.Sleep(gap)
		}
		if _, err := js.Publish(ctx, "jobs.m.regular", strconv.AppendInt(nil, time.Now().UnixNano(), 10)); err != nil {
			b.Fatal(err)
		}
		select {
		case h := <-hops:
			job, reply = append(job, h.job), append(reply, h.reply)
		case <-time.After(10 * time.Second):
			b.Fatal("no reply from the floor agent")
		}
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"job", job}, {"reply", reply}} {
		sort.Slice(m.d, func(i, j int) bool { return m.d[i] < m.d[j] })
		b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds()), m.name+"-p50-µs")
		b.ReportMetric(float64(m.d[len(m.d)*99/100].Microseconds()), m.name+"-p99-µs")
	}
}

// TestFloorAgentProcess is BenchmarkNATSFloor's agent when the benchmark
// runs it as a process of its own; it does nothing in a normal test run.
func TestFloorAgentProcess(t *testing.T) {
	url := os.Getenv("SWITCHYARD_FLOOR_AGENT")
	if url == "" {
		t.Skip("the agent side of BenchmarkNATSFloor")
	}
	if err := floorAgent(context.Background(), url); err != nil {
		t.Fatal(err)
	}
}

// floorAgent keeps one waiting pull request for many jobs, as agent.pull
// keeps one for its free slots, and answers each job on the reply subject
// with the job's send time, its own receive time and the reply's send time.
func floorAgent(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(ctx, "JOBS", "w")
	if err != nil {
		return err
	}
	announced := false
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1<<20, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			continue
		}
		if !announced {
			// The pull request is written with Fetch; a flush makes sure
			// the server has it before the benchmark publishes.
			if err := nc.Flush(); err != nil {
				return err
			}
			if err := nc.Publish("reply.b.r", []byte("ready")); err != nil {
				return err
			}
			announced = true
		}
		for msg := range batch.Messages() {
			at := time.Now().UnixNano()
			_ = msg.Ack()
			out := fmt.Appendf(nil, "%s %d %d", msg.Data(), at, time.Now().UnixNano())
			if err := nc.Publish("reply.b.r", out); err != nil {
				return err
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	return nil
}
