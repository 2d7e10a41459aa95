package vllmgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/vllmgrpc"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

const model = "sim-model"

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// run starts f; cleanup cancels it and waits.
func run(t *testing.T, f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { cancel(); <-done }) })
}

type fleet struct {
	t  *testing.T
	ns string
	b  *broker.Broker
}

func newFleet(t *testing.T) *fleet {
	ns := natstest.RunJetStream(t)
	f := &fleet{t: t, ns: ns.ClientURL()}
	b, err := broker.New(f.connect(), broker.Config{HeartbeatInterval: 50 * time.Millisecond, WatchInterval: 50 * time.Millisecond}, broker.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	run(t, b.Run)
	f.b = b
	return f
}

func (f *fleet) connect() *nats.Conn {
	nc, err := nats.Connect(f.ns)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(nc.Close)
	return nc
}

// addAgent starts a simulator serving gRPC and an agent on it through the
// vllm-grpc adapter.
func (f *fleet) addAgent(id string, role simengine.Role) *simengine.Engine {
	t := f.t
	cfg := simengine.DefaultConfig()
	cfg.Model, cfg.TTFT, cfg.ITL, cfg.Slots = model, time.Millisecond, time.Millisecond, 4
	cfg.BootstrapPort = 0
	pool, proto := subjects.PoolRegular, ""
	if role != simengine.RoleRegular {
		cfg.Role, cfg.PDProtocol = role, simengine.PDVLLM
		pool, proto = string(role), "vllm"
	}
	e, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := e.GRPCServer()
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	ad, err := vllmgrpc.New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ad.Close() })
	a, err := agent.New(f.connect(), ad, agent.Config{
		ID: id, Model: model, Pool: pool, PDProtocol: proto, Slots: cfg.Slots,
		// 500ms heartbeats (stale after 1.5s): 50ms ones went stale while a
		// busy machine starved the test process, and calls gave up on them.
		Heartbeat: 500 * time.Millisecond,
		Engine:    "vllm-grpc", Transport: "grpc", PullWait: 200 * time.Millisecond,
	}, agent.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	return e
}

// waitReady waits until the broker has heard every agent as ready.
func (f *fleet) waitReady(ids ...string) {
	testwait.For(f.t, 10*time.Second, 10*time.Millisecond, func() error {
		if !slices.Contains(f.b.Models(), model) {
			return fmt.Errorf("models %v", f.b.Models())
		}
		for _, id := range ids {
			if !slices.ContainsFunc(f.b.Heartbeats(), func(h *wire.Heartbeat) bool {
				return h.GetAgentId() == id && h.GetState() == "ready"
			}) {
				return fmt.Errorf("agent %s not ready", id)
			}
		}
		return f.b.Ready()
	})
}

// call submits body and reads the call to its final chunk.
func (f *fleet) call(api wire.API, body string) (string, *wire.Chunk, error) {
	ctx, cancel := context.WithTimeout(f.t.Context(), 20*time.Second)
	defer cancel()
	c, err := f.b.Submit(ctx, broker.Request{Model: model, API: api, Stream: true, Body: []byte(body)})
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	var sb strings.Builder
	for {
		ch, err := c.Next(ctx)
		if err != nil {
			return sb.String(), nil, err
		}
		switch ch.GetKind() {
		case wire.Chunk_KIND_TOKEN:
			for _, ev := range ch.GetEvents() {
				sb.WriteString(ev.GetDeltaText())
			}
		case wire.Chunk_KIND_FINAL:
			// A chunk from Next is valid until the call's next Next or
			// Close (the broker reuses it): keep a copy.
			return sb.String(), proto.CloneOf(ch), nil
		case wire.Chunk_KIND_ERROR:
			ch = proto.CloneOf(ch)
			return sb.String(), ch, ch.GetError()
		}
	}
}

func (f *fleet) expectServed(api wire.API, body string) {
	t := f.t
	t.Helper()
	sapi := simengine.APIChat
	if api == wire.API_API_COMPLETION {
		sapi = simengine.APICompletion
	}
	x, err := simengine.Expect(sapi, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	text, final, err := f.call(api, body)
	if err != nil {
		t.Fatalf("call: %v (text so far %q)", err, text)
	}
	u := final.GetUsage()
	if text != x.Text || final.GetFinishReason() != x.FinishReason ||
		int(u.GetPromptTokens()) != x.PromptTokens || int(u.GetCompletionTokens()) != x.CompletionTokens {
		t.Fatalf("got %q %s %v, want %q %s %d/%d", text, final.GetFinishReason(), u, x.Text, x.FinishReason, x.PromptTokens, x.CompletionTokens)
	}
}

func TestAgentServesOverVLLMGRPC(t *testing.T) {
	f := newFleet(t)
	f.addAgent("grpc-1", simengine.RoleRegular)
	f.waitReady("grpc-1")
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			f.expectServed(wire.API_API_CHAT, fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"story %d"}],"max_tokens":%d}`, model, i, 10+5*i))
		})
	}
	wg.Wait()
	f.expectServed(wire.API_API_COMPLETION, `{"model":"sim-model","prompt":"Once upon a time","max_tokens":30,"stop":"e"}`)

	_, _, err := f.call(wire.API_API_CHAT, `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":2000000}`)
	if !errors.Is(err, &wire.Error{Code: wire.CodeBadRequest}) {
		t.Fatalf("oversized max_tokens: %v, want %s", err, wire.CodeBadRequest)
	}
}

func TestAgentVLLMPDOverGRPC(t *testing.T) {
	f := newFleet(t)
	f.addAgent("prefill-1", simengine.RolePrefill)
	dec := f.addAgent("decode-1", simengine.RoleDecode)
	f.waitReady("prefill-1", "decode-1")
	for i := range 3 {
		f.expectServed(wire.API_API_CHAT, fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"tell me %d things"}],"max_tokens":20}`, model, i))
	}
	f.expectServed(wire.API_API_COMPLETION, `{"model":"sim-model","prompt":"the sea","max_tokens":15}`)
	if n := dec.KVTransferFailures(); n != 0 {
		t.Fatalf("%d KV transfer failures", n)
	}
}
