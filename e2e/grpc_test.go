package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/vllmpb"
)

func grpcClient(t testing.TB, addr string) switchyardv1.SwitchyardClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return switchyardv1.NewSwitchyardClient(cc)
}

type grpcResult struct {
	text, finish, route, agent string
	usage                      *switchyardv1.Usage
}

func readGRPC(t testing.TB, s grpc.ServerStreamingClient[switchyardv1.StreamResponse]) grpcResult {
	t.Helper()
	var r grpcResult
	var text strings.Builder
	for {
		m, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev := m.GetEvent().(type) {
		case *switchyardv1.StreamResponse_Start:
			r.route, r.agent = ev.Start.GetRoute(), ev.Start.GetAgent()
		case *switchyardv1.StreamResponse_Delta:
			text.WriteString(ev.Delta.GetDeltaText())
		case *switchyardv1.StreamResponse_Done:
			r.finish, r.usage = ev.Done.GetFinishReason(), ev.Done.GetUsage()
		}
	}
	r.text = text.String()
	return r
}

// startGRPCEngine serves a sim-engine's vLLM gRPC engine service.
func startGRPCEngine(t testing.TB, cfg simengine.Config) (*simengine.Engine, string) {
	t.Helper()
	se, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := se.GRPCServer()
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(func() { gs.Stop(); _ = se.Close() })
	// Healthy is the state the vllm-grpc adapter waits for.
	cc, err := grpc.NewClient(ln.Addr().String(), grpcInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h, err := vllmpb.NewVllmEngineClient(cc).HealthCheck(ctx, &vllmpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if !h.GetHealthy() {
			return fmt.Errorf("engine unhealthy: %s", h.GetMessage())
		}
		return nil
	})
	return se, ln.Addr().String()
}

// TestGRPCParity: the same requests over HTTP and gRPC ingress give the same
// text and usage, streaming.
func TestGRPCParity(t *testing.T) {
	b := cmdtest.StartBroker(t)
	startAgent(t, b.NATS, "a1", fastEngine(t, 4), 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	client := grpcClient(t, b.GRPC)
	ctx := context.Background()
	for i := range 4 {
		prompt := fmt.Sprintf("parity check %d", i)
		want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":14}`, prompt))
		httpRes, err := rawStream(ctx, b.HTTP, prompt, 14)
		if err != nil || httpRes.text != want.Text {
			t.Fatalf("http %+v %v", httpRes, err)
		}
		var hdr metadata.MD
		s, err := client.Chat(ctx, &switchyardv1.ChatRequest{
			Model: model, Messages: []*switchyardv1.Message{{Role: "user", Content: prompt}},
			MaxTokens: ptr(uint32(14)), IncludeUsage: true,
		}, grpc.Header(&hdr))
		if err != nil {
			t.Fatal(err)
		}
		g := readGRPC(t, s)
		if g.text != httpRes.text || g.finish != want.FinishReason {
			t.Fatalf("grpc %q (%s), http %q", g.text, g.finish, httpRes.text)
		}
		if g.usage.GetCompletionTokens() != uint32(want.CompletionTokens) || g.usage.GetPromptTokens() != uint32(want.PromptTokens) {
			t.Fatalf("grpc usage %v, want %d+%d", g.usage, want.PromptTokens, want.CompletionTokens)
		}
		if g.route != "regular" || g.agent != "a1" || len(hdr.Get("x-switchyard-route")) == 0 {
			t.Fatalf("start %+v header %v", g, hdr)
		}
	}
	wantC := expect(t, simengine.APICompletion, `{"prompt":"grpc completes too","max_tokens":5}`)
	s, err := client.Complete(ctx, &switchyardv1.CompletionRequest{Model: model, Prompt: "grpc completes too", MaxTokens: ptr(uint32(5))})
	if err != nil {
		t.Fatal(err)
	}
	if g := readGRPC(t, s); g.text != wantC.Text || g.usage != nil {
		t.Fatalf("complete %+v, want %q and no usage", g, wantC.Text)
	}
}

func ptr[T any](v T) *T { return &v }

// TestVLLMGRPCEngines: agents with the vllm-grpc adapter in front of the
// simulator's gRPC engine service serve regular and PD requests end to end.
func TestVLLMGRPCEngines(t *testing.T) {
	b := cmdtest.StartBroker(t)
	cfg := func(role simengine.Role) simengine.Config {
		return simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4, Role: role, PDProtocol: simengine.PDVLLM}
	}
	_, regAddr := startGRPCEngine(t, cfg(simengine.RoleRegular))
	_, preAddr := startGRPCEngine(t, cfg(simengine.RolePrefill))
	_, decAddr := startGRPCEngine(t, cfg(simengine.RoleDecode))
	grpcAgent := func(id, addr, role string) {
		startAgentCmd(t, b.NATS, "--nats-url", b.NATS, "--engine", "vllm-grpc", "--engine-url", addr, "--model", model,
			"--role", role, "--id", id, "--slots", "4", "--heartbeat", liveHeartbeat, "--log-level", "warn", "--slow-start", "0")
	}
	grpcAgent("g-reg", regAddr, "regular")
	cmdtest.WaitEligible(t, b.HTTP, "g-reg")
	for i := range 3 {
		prompt := fmt.Sprintf("gRPC engine %d says", i)
		want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":12}`, prompt))
		r, err := rawStream(context.Background(), b.HTTP, prompt, 12)
		if err != nil || r.text != want.Text || r.agent != "g-reg" {
			t.Fatalf("regular over vllm-grpc: %+v %v, want %q", r, err, want.Text)
		}
	}
	grpcAgent("g-pre", preAddr, "prefill")
	grpcAgent("g-dec", decAddr, "decode")
	cmdtest.WaitEligible(t, b.HTTP, "g-pre", "g-dec")
	pdSeen := 0
	for i := range 12 {
		prompt := fmt.Sprintf("disaggregated over gRPC %d", i)
		want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":9}`, prompt))
		r, err := rawStream(context.Background(), b.HTTP, prompt, 9)
		if err != nil || r.text != want.Text {
			t.Fatalf("request %d: %+v %v, want %q", i, r, err, want.Text)
		}
		if r.route == "pd" {
			pdSeen++
			if r.agent != "g-pre,g-dec" {
				t.Fatalf("pd agents %q", r.agent)
			}
		}
	}
	if pdSeen == 0 {
		t.Fatal("no request took the PD route over gRPC engines")
	}
}

// TestMixedTransportPool: one model served by an HTTP-engine agent and a
// gRPC-engine agent; traffic spreads across both in proportion to slots.
func TestMixedTransportPool(t *testing.T) {
	b := cmdtest.StartBroker(t)
	httpEng := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 3 * time.Millisecond, Slots: 2})
	_, gAddr := startGRPCEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 3 * time.Millisecond, Slots: 6})
	startAgent(t, b.NATS, "http-agent", httpEng, 2)
	startAgentCmd(t, b.NATS, "--nats-url", b.NATS, "--engine", "vllm-grpc", "--engine-url", gAddr, "--model", model,
		"--id", "grpc-agent", "--slots", "6", "--heartbeat", liveHeartbeat, "--log-level", "warn", "--slow-start", "0")
	cmdtest.WaitEligible(t, b.HTTP, "http-agent", "grpc-agent")
	const n = 64
	type res struct {
		r   streamResult
		err error
	}
	out := make(chan res, n)
	sem := make(chan struct{}, 8) // 8 clients: exactly the pool's slots
	for i := range n {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r, err := rawStream(context.Background(), b.HTTP, fmt.Sprintf("mixed pool request %d", i), 16)
			out <- res{r, err}
		}()
	}
	by := map[string]int{}
	for range n {
		x := <-out
		if x.err != nil || !x.r.done {
			t.Fatalf("%+v %v", x.r, x.err)
		}
		by[x.r.agent]++
	}
	t.Logf("split %v (slots http 2, grpc 6)", by)
	if by["http-agent"] == 0 || by["grpc-agent"] == 0 {
		t.Fatalf("split %v: both transports must serve", by)
	}
	if by["grpc-agent"] <= by["http-agent"] {
		t.Fatalf("split %v: the 6-slot gRPC agent must take more than the 2-slot HTTP agent", by)
	}
	if p := httpEng.peak.Load(); p > 2 {
		t.Fatalf("HTTP engine ran %d at once, slots 2", p)
	}
}
