//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

func jobsStorage(t *testing.T, natsURL string) jetstream.StorageType {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// cmdtest.StartBroker returned once the stream existed; poll anyway, as the
	// JetStream API may answer slowly on a busy machine.
	var st jetstream.Stream
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err = js.Stream(ctx, "SWITCHYARD_JOBS")
		return err
	})
	return st.CachedInfo().Config.Storage
}

// TestJobsStorage: the jobs stream is on disk unless --jobs-storage memory
// asks for memory; a stream created with the other storage keeps it (with a
// warning) and the broker serves on it.
func TestJobsStorage(t *testing.T) {
	t.Run("default file", func(t *testing.T) {
		b := cmdtest.StartBroker(t)
		if got := jobsStorage(t, b.NATS); got != jetstream.FileStorage {
			t.Fatalf("storage %v, want file", got)
		}
	})
	t.Run("memory", func(t *testing.T) {
		b := cmdtest.StartBroker(t, "--jobs-storage", "memory")
		if got := jobsStorage(t, b.NATS); got != jetstream.MemoryStorage {
			t.Fatalf("storage %v, want memory", got)
		}
	})
	t.Run("existing stream keeps its storage", func(t *testing.T) {
		ns := startNATSProcess(t, t.TempDir())
		first := cmdtest.StartBroker(t, "--nats-url", ns.URL(), "--jobs-storage", "memory")
		if err := first.Stop(t); err != nil {
			t.Fatal(err)
		}
		b := cmdtest.StartBroker(t, "--nats-url", ns.URL())
		e := fastEngine(t, 2)
		startAgent(t, ns.URL(), "a1", e, 2)
		cmdtest.WaitEligible(t, b.HTTP, "a1")
		if r, err := rawStream(context.Background(), b.HTTP, "still served", 4); err != nil || !r.done {
			t.Fatalf("request on the kept stream: %+v %v", r, err)
		}
		if got := jobsStorage(t, ns.URL()); got != jetstream.MemoryStorage {
			t.Fatalf("storage %v, want the memory storage it was created with", got)
		}
		if !strings.Contains(b.Err.String(), "keeps the storage it was created with") {
			t.Fatalf("no warning in the broker's log:\n%s", b.Err.String())
		}
	})
	t.Run("bad value", func(t *testing.T) {
		err := brokerRun(context.Background(), []string{"--jobs-storage", "disk"}, cmdtest.NoEnv, &cmdtest.Buffer{}, &cmdtest.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "want memory or file") {
			t.Fatalf("err %v", err)
		}
	})
}

// TestQueuedJobOutlivesMemoryStream: a job still queued when the NATS
// server holding the (memory) jobs stream restarts is lost with the
// stream; the broker notices that nobody accepted it and the queue reads
// empty, dispatches it again, and the client gets its whole answer.
func TestQueuedJobOutlivesMemoryStream(t *testing.T) {
	ns := startNATSProcess(t, t.TempDir())
	// Heartbeats every second: the agent stays in the table (3 missed
	// intervals) while the server restarts.
	b := cmdtest.StartBroker(t, "--nats-url", ns.URL(), "--heartbeat-interval", "1s", "--jobs-storage", "memory")
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 40 * time.Millisecond, Slots: 1})
	startAgent(t, ns.URL(), "a1", e, 1, "--heartbeat", "1s")
	cmdtest.WaitEligible(t, b.HTTP, "a1")

	// The only slot is busy for a few seconds: the simulator answers this
	// prompt with 174 tokens, 7 s at 40 ms each...
	const hold = "holding the only slot 154"
	hangUp, held := openStream(t, b.HTTP, hold, 400)
	defer hangUp()
	// ...so the next request waits in the queue.
	const prompt = "queued through a restart"
	got := make(chan streamResult, 1)
	go func() {
		r, err := rawStream(context.Background(), b.HTTP, prompt, 8)
		if err != nil {
			r.errMsg = err.Error()
		}
		got <- r
	}()
	testwait.For(t, 3*time.Second, 5*time.Millisecond, func() error {
		for _, m := range getFleetFull(t, b.HTTP).Models {
			if m.Queue["regular"] == 1 {
				return nil
			}
		}
		select {
		case r := <-got:
			t.Fatalf("the request ended before the restart: %+v; engine peak %d served %d", r, e.peak.Load(), e.served.Load())
		default:
		}
		return fmt.Errorf("the request is not queued yet: %+v", getFleetFull(t, b.HTTP).Models)
	})
	ns.Stop(t)
	ns.Start(t)
	// The holding stream ends with an error (NATS went away under it) and
	// the client hangs up, which frees the slot once NATS carries the cancel.
	hangUp()
	<-held

	select {
	case r := <-got:
		want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":8}`, prompt))
		if r.status != http.StatusOK || !r.done || r.errMsg != "" || r.text != want.Text {
			t.Fatalf("queued request: status %d done %v err %q text %q, want %q", r.status, r.done, r.errMsg, r.text, want.Text)
		}
		// It was served by a second attempt: the first one's job died
		// with the stream.
		resp, err := http.Get(b.HTTP + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics := readAll(resp)
		resp.Body.Close()
		if !strings.Contains(metrics, `switchyard_retries_total{reason="agent_lost"} 1`) {
			t.Fatalf("want one agent_lost retry in the metrics:\n%s", metrics)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the queued request did not finish")
	}
}
