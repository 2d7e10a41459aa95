package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/wire"
)

// replySpy records every chunk on the broker's reply subjects.
type replySpy struct {
	mu     sync.Mutex
	chunks []*wire.Chunk
}

func spyReplies(t *testing.T, natsURL string, on func(nc *nats.Conn, m *nats.Msg, c *wire.Chunk)) *replySpy {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s := &replySpy{}
	_, err = nc.Subscribe("sy.reply.>", func(m *nats.Msg) {
		// A message holds one or more framed chunks, possibly of several
		// requests.
		if err := wire.Frames(m.Data, func(b []byte) error {
			c := new(wire.Chunk)
			if err := proto.Unmarshal(b, c); err != nil {
				return err
			}
			s.mu.Lock()
			s.chunks = append(s.chunks, c)
			s.mu.Unlock()
			if on != nil {
				on(nc, m, c)
			}
			return nil
		}); err != nil {
			t.Errorf("undecodable chunk on %s: %v", m.Subject, err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// scriptedEngine serves the simulator's API (models, health, metrics)
// with POSTs answered by post: an engine whose stream the test writes.
func scriptedEngine(t *testing.T, post http.HandlerFunc) *engine {
	t.Helper()
	se, err := simengine.New(simengine.Config{Model: model, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = se.Close() })
	sim := se.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			sim.ServeHTTP(w, r)
			return
		}
		post(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	e := &engine{URL: "http://" + ln.Addr().String()}
	cmdtest.WaitHealthy(t, e.URL)
	return e
}

// waitFinal waits until the spy has seen an attempt's final chunk.
func (s *replySpy) waitFinal(t *testing.T) {
	t.Helper()
	testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.chunks {
			if c.GetKind() == wire.Chunk_KIND_FINAL {
				return nil
			}
		}
		return fmt.Errorf("no final chunk seen yet")
	})
}

// burstEngine writes a chat stream in bursts: each burst's events in one
// write and one flush, a pause between bursts, as a fast engine under load
// sends them.
func burstEngine(t *testing.T, bursts, perBurst int) *engine {
	return scriptedEngine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		n := 0
		for range bursts {
			var b strings.Builder
			for range perBurst {
				fmt.Fprintf(&b, "data: {\"id\":\"burst\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\" w%d\"},\"finish_reason\":null}]}\n\n", model, n)
				n++
			}
			_, _ = w.Write([]byte(b.String()))
			_ = rc.Flush()
			time.Sleep(20 * time.Millisecond)
		}
		fmt.Fprintf(w, "data: {\"id\":\"burst\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n", model)
		fmt.Fprintf(w, "data: {\"id\":\"burst\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", n, n+3)
	})
}

// TestBurstsTravelTogether: engine chunks that arrive together leave the
// agent as one NATS message (never more than one burst per message), and
// the client still gets every event, in order, as its own SSE event.
func TestBurstsTravelTogether(t *testing.T) {
	const bursts, perBurst = 5, 20
	b := cmdtest.StartBroker(t)
	startAgent(t, b.NATS, "a1", burstEngine(t, bursts, perBurst), 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	spy := spyReplies(t, b.NATS, nil)

	r, err := rawStream(context.Background(), b.HTTP, "bursts", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusOK || !r.done || r.errMsg != "" {
		t.Fatalf("status %d done %v err %q", r.status, r.done, r.errMsg)
	}
	var want strings.Builder
	for i := range bursts * perBurst {
		fmt.Fprintf(&want, " w%d", i)
	}
	if r.text != want.String() {
		t.Fatalf("client got %q, want %q", r.text, want.String())
	}
	// The spy's own subscription may still be behind the broker's.
	spy.waitFinal(t)
	spy.mu.Lock()
	defer spy.mu.Unlock()
	var sizes []int
	events := 0
	for _, c := range spy.chunks {
		if c.GetKind() == wire.Chunk_KIND_TOKEN {
			sizes = append(sizes, len(c.GetEvents()))
			events += len(c.GetEvents())
		}
	}
	// 100 content events and the finish event.
	if events != bursts*perBurst+1 {
		t.Fatalf("%d events in token messages %v, want %d", events, sizes, bursts*perBurst+1)
	}
	// One burst is one read at the agent in the common case; allow a
	// burst to be split by the TCP stack, never merged with the next
	// (the engine pauses between them).
	if len(sizes) < bursts || len(sizes) > 3*bursts {
		t.Fatalf("token messages %v: want about one per burst (%d bursts)", sizes, bursts)
	}
	for _, n := range sizes {
		if n > perBurst+1 {
			t.Fatalf("token messages %v: a message holds more than a burst", sizes)
		}
	}
	t.Logf("%d events in %d token messages: %v", events, len(sizes), sizes)
}

// TestOneSpeakerPerAttempt: agents speak before their ack is confirmed, so
// in a failover two agents could run one attempt. The broker relays only
// the first that spoke; the other's chunks never reach the client.
func TestOneSpeakerPerAttempt(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: 30 * time.Millisecond, ITL: time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	var once sync.Once
	spy := spyReplies(t, b.NATS, func(nc *nats.Conn, m *nats.Msg, c *wire.Chunk) {
		if c.GetAgentId() != "a1" || c.GetKind() != wire.Chunk_KIND_ACCEPTED {
			return
		}
		// A second agent claims the same attempt while a1's engine is
		// still before its first token. It got the same job (an ack lost
		// in a failover), so it has the attempt's secret.
		once.Do(func() {
			for i, k := range []wire.Chunk_Kind{wire.Chunk_KIND_ACCEPTED, wire.Chunk_KIND_TOKEN, wire.Chunk_KIND_TOKEN} {
				g := &wire.Chunk{RequestId: c.GetRequestId(), Attempt: c.GetAttempt(), Seq: uint64(i), AgentId: "ghost", Kind: k, Secret: c.GetSecret()}
				if k == wire.Chunk_KIND_TOKEN {
					g.Events = []*wire.Event{{Raw: []byte(`{"id":"ghost","choices":[{"index":0,"delta":{"content":" GHOST"}}]}`), DeltaText: " GHOST"}}
				}
				data, _ := wire.AppendFrame([]byte{wire.FrameMarker}, g)
				_ = nc.Publish(m.Subject, data)
			}
		})
	})
	const prompt = "only one voice"
	r, err := rawStream(context.Background(), b.HTTP, prompt, 12)
	if err != nil {
		t.Fatal(err)
	}
	want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":12}`, prompt))
	if r.status != http.StatusOK || !r.done || r.errMsg != "" || r.text != want.Text {
		t.Fatalf("status %d done %v err %q text %q, want %q", r.status, r.done, r.errMsg, r.text, want.Text)
	}
	if r.agent != "a1" {
		t.Fatalf("x-switchyard-agent %q, want a1", r.agent)
	}
	spy.waitFinal(t)
	spy.mu.Lock()
	defer spy.mu.Unlock()
	ghost := 0
	for _, c := range spy.chunks {
		if c.GetAgentId() == "ghost" {
			ghost++
		}
	}
	if ghost != 3 {
		t.Fatalf("the ghost sent %d chunks, want 3 (the test did not exercise the race)", ghost)
	}
}

// TestStallTimeout: an agent that keeps heartbeating but whose engine goes
// quiet mid-stream is given up on after --stall-timeout: the stream is
// migrated once (the engine stalls again) and then ends with one error
// event, the stall measured from the last chunk, not from the request.
func TestStallTimeout(t *testing.T) {
	const stall = 400 * time.Millisecond
	b := cmdtest.StartBroker(t, "--stall-timeout", stall.String())
	e := scriptedEngine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		// Tokens for a while (the stall must count from the last one),
		// then silence until the agent hangs up.
		for i := range 8 {
			fmt.Fprintf(w, "data: {\"id\":\"s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" t%d\"},\"finish_reason\":null}]}\n\n", i)
			_ = rc.Flush()
			time.Sleep(stall / 4)
		}
		<-r.Context().Done()
	})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")

	start := time.Now()
	r, err := rawStream(context.Background(), b.HTTP, "a stalling engine", 100)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if r.status != http.StatusOK || r.done || !strings.Contains(r.errMsg, "nothing for") {
		t.Fatalf("status %d done %v err %q: want one stall error event", r.status, r.done, r.errMsg)
	}
	// Two attempts of 8 tokens each, the stream migrated once.
	if !strings.Contains(r.errMsg, "after 16 tokens and 1 migrations") {
		t.Fatalf("err %q: want the stream broken after two attempts of 8 tokens", r.errMsg)
	}
	// Each attempt's 8 tokens take 2 stalls' worth and it is given up one
	// stall after its last: about 6 stalls in all, never fewer than 5 if
	// the stall counts from the last chunk. A busy machine only makes it
	// longer, so there is no upper bound in time.
	if took < 5*stall {
		t.Fatalf("stream ended after %s, want about %s: the stall counted from before the last chunk", took, 6*stall)
	}
	t.Logf("ended after %s (stall timeout %s): %s", took.Round(time.Millisecond), stall, r.errMsg)
}
