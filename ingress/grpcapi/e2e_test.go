package grpcapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/sim"
	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

const model = "m"

// env is an embedded NATS server, a broker, one agent on the in-process
// simulator, and the gRPC ingress in front of the broker.
type env struct {
	b         *broker.Broker
	eng       *simengine.Engine
	conn      *grpc.ClientConn
	client    switchyardv1.SwitchyardClient
	stopAgent func()
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newEnv(t *testing.T, bcfg broker.Config, scfg simengine.Config) *env {
	t.Helper()
	ns := natstest.RunJetStream(t)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	if bcfg.HeartbeatInterval == 0 {
		bcfg.HeartbeatInterval = 50 * time.Millisecond
	}
	b, err := broker.New(connect(), bcfg, broker.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	run(t, b.Run)

	scfg.Model = model
	eng, err := simengine.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(connect(), sim.New(eng), agent.Config{
		ID: "agent-1", Model: model, Slots: scfg.Slots,
		// 500ms heartbeats (stale after 1.5s): 50ms ones go stale while a
		// busy machine starves the test process.
		Heartbeat: 500 * time.Millisecond,
		Engine:    "sim", Transport: "inproc", PullWait: 200 * time.Millisecond,
	}, agent.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	stopAgent := run(t, a.Run)
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !slices.Contains(b.Models(), model) {
			return fmt.Errorf("models %v, want %q", b.Models(), model)
		}
		return b.Ready()
	})
	conn := serve(t, New(b, Config{}, WithLogger(quiet())), Config{})
	return &env{b: b, eng: eng, conn: conn, client: switchyardv1.NewSwitchyardClient(conn), stopAgent: stopAgent}
}

// run starts f in a goroutine; the returned stop (also called at cleanup)
// cancels its context and waits for it.
func run(t *testing.T, f func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// result is one stream read to its end.
type result struct {
	header metadata.MD
	start  *switchyardv1.StreamStart
	text   strings.Builder
	deltas []*switchyardv1.StreamDelta
	done   *switchyardv1.StreamDone
	err    error
}

func readAll(stream grpc.ServerStreamingClient[switchyardv1.StreamResponse]) *result {
	r := &result{}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			r.err = err
			break
		}
		switch ev := msg.GetEvent().(type) {
		case *switchyardv1.StreamResponse_Start:
			r.start = ev.Start
		case *switchyardv1.StreamResponse_Delta:
			r.deltas = append(r.deltas, ev.Delta)
			r.text.WriteString(ev.Delta.GetDeltaText())
		case *switchyardv1.StreamResponse_Done:
			r.done = ev.Done
		}
	}
	r.header, _ = stream.Header()
	return r
}

func expect(t *testing.T, api simengine.API, body string) simengine.Expectation {
	t.Helper()
	x, err := simengine.Expect(api, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func fast() simengine.Config {
	return simengine.Config{TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4}
}

func TestStream(t *testing.T) {
	e := newEnv(t, broker.Config{}, fast())
	tests := []struct {
		name  string
		call  func(ctx context.Context) (grpc.ServerStreamingClient[switchyardv1.StreamResponse], error)
		api   simengine.API
		body  string // the OpenAI body the simulator must see, for Expect
		usage bool
	}{
		{
			name: "chat with usage",
			call: func(ctx context.Context) (grpc.ServerStreamingClient[switchyardv1.StreamResponse], error) {
				return e.client.Chat(ctx, &switchyardv1.ChatRequest{
					Model: model, MaxTokens: proto.Uint32(12), IncludeUsage: true,
					Messages: []*switchyardv1.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Tell me about NATS"}},
				})
			},
			api:   simengine.APIChat,
			body:  `{"model":"m","max_tokens":12,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me about NATS"}]}`,
			usage: true,
		},
		{
			name: "chat without usage, model implied",
			call: func(ctx context.Context) (grpc.ServerStreamingClient[switchyardv1.StreamResponse], error) {
				return e.client.Chat(ctx, &switchyardv1.ChatRequest{MaxTokens: proto.Uint32(7), Messages: user("hello")})
			},
			api:  simengine.APIChat,
			body: `{"max_tokens":7,"messages":[{"role":"user","content":"hello"}]}`,
		},
		{
			name: "complete with usage",
			call: func(ctx context.Context) (grpc.ServerStreamingClient[switchyardv1.StreamResponse], error) {
				return e.client.Complete(ctx, &switchyardv1.CompletionRequest{Model: model, Prompt: "Once upon a time", MaxTokens: proto.Uint32(9), IncludeUsage: true})
			},
			api:   simengine.APICompletion,
			body:  `{"model":"m","prompt":"Once upon a time","max_tokens":9}`,
			usage: true,
		},
		{
			name: "complete with max_tokens from extra_json",
			call: func(ctx context.Context) (grpc.ServerStreamingClient[switchyardv1.StreamResponse], error) {
				return e.client.Complete(ctx, &switchyardv1.CompletionRequest{Model: model, Prompt: "Once", ExtraJson: `{"max_tokens": 5, "ignore_eos": true}`})
			},
			api:  simengine.APICompletion,
			body: `{"model":"m","prompt":"Once","max_tokens":5}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := expect(t, tt.api, tt.body)
			ctx := metadata.AppendToOutgoingContext(t.Context(), "x-request-id", "client-"+strings.ReplaceAll(tt.name, " ", "-"))
			stream, err := tt.call(ctx)
			if err != nil {
				t.Fatal(err)
			}
			r := readAll(stream)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if got := r.text.String(); got != want.Text {
				t.Errorf("text %q, want %q", got, want.Text)
			}
			if r.start == nil || r.start.GetRequestId() != "client-"+strings.ReplaceAll(tt.name, " ", "-") ||
				r.start.GetRoute() != "regular" || r.start.GetAgent() != "agent-1" || r.start.GetModel() != model {
				t.Errorf("start %v", r.start)
			}
			for k, v := range map[string]string{HeaderRequestID: r.start.GetRequestId(), HeaderRoute: "regular", HeaderAgent: "agent-1"} {
				if got := r.header.Get(k); len(got) != 1 || got[0] != v {
					t.Errorf("header %s: %q, want %q", k, got, v)
				}
			}
			if len(r.deltas) == 0 || !json.Valid(r.deltas[0].GetRawChunkJson()) {
				t.Errorf("first delta's raw chunk is not JSON: %v", r.deltas)
			}
			if r.done == nil {
				t.Fatal("no done message")
			}
			if r.done.GetFinishReason() != want.FinishReason {
				t.Errorf("finish reason %q, want %q", r.done.GetFinishReason(), want.FinishReason)
			}
			u := r.done.GetUsage()
			switch {
			case !tt.usage && u != nil:
				t.Errorf("usage %v sent without include_usage", u)
			case tt.usage && (u.GetPromptTokens() != uint32(want.PromptTokens) || u.GetCompletionTokens() != uint32(want.CompletionTokens) ||
				u.GetTotalTokens() != uint32(want.PromptTokens+want.CompletionTokens)):
				t.Errorf("usage %v, want %d+%d", u, want.PromptTokens, want.CompletionTokens)
			case tt.usage && !json.Valid(r.done.GetRawChunkJson()):
				t.Errorf("raw usage chunk %q is not JSON", r.done.GetRawChunkJson())
			}
		})
	}

	t.Run("list models", func(t *testing.T) {
		resp, err := e.client.ListModels(t.Context(), &switchyardv1.ListModelsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetModels()) != 1 || resp.GetModels()[0].GetId() != model {
			t.Errorf("models %v, want [%s]", resp.GetModels(), model)
		}
	})

	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name string
			req  *switchyardv1.ChatRequest
			code codes.Code
		}{
			{"empty messages", &switchyardv1.ChatRequest{Model: model}, codes.InvalidArgument},
			{"bad extra_json", &switchyardv1.ChatRequest{Model: model, Messages: user("x"), ExtraJson: `[]`}, codes.InvalidArgument},
			{"bad range", &switchyardv1.ChatRequest{Model: model, Messages: user("x"), TopP: proto.Float64(1.5)}, codes.InvalidArgument},
			// Passes the ingress; the simulator refuses it (bad_request chunk).
			{"engine bad request", &switchyardv1.ChatRequest{Model: model, Messages: user("x"), ExtraJson: `{"max_completion_tokens": -3}`}, codes.InvalidArgument},
			{"unknown model", &switchyardv1.ChatRequest{Model: "nope", Messages: user("x")}, codes.NotFound},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				stream, err := e.client.Chat(t.Context(), tt.req)
				if err != nil {
					t.Fatal(err)
				}
				r := readAll(stream)
				if status.Code(r.err) != tt.code {
					t.Fatalf("got %v, want %s", r.err, tt.code)
				}
				if len(r.header.Get(HeaderRequestID)) != 1 {
					t.Errorf("no x-request-id with the error: %v", r.header)
				}
			})
		}
	})

	t.Run("slo targets", func(t *testing.T) {
		for _, tt := range []struct {
			name       string
			md         []string
			ttft, itl  *float64
			code       codes.Code
			names      string // what the error names
			wantCounts bool   // the broker counts the request against its targets
		}{
			{name: "none", code: codes.OK},
			{name: "metadata", md: []string{MetadataSLOTTFT, "60000"}, code: codes.OK, wantCounts: true},
			{name: "fields", ttft: proto.Float64(60000), itl: proto.Float64(1000), code: codes.OK, wantCounts: true},
			{name: "field over metadata", md: []string{MetadataSLOTTFT, "soon"}, ttft: proto.Float64(60000), code: codes.OK, wantCounts: true},
			{name: "bad ttft metadata", md: []string{MetadataSLOTTFT, "soon"}, code: codes.InvalidArgument, names: MetadataSLOTTFT},
			{name: "bad itl metadata", md: []string{MetadataSLOITL, "-5"}, code: codes.InvalidArgument, names: MetadataSLOITL},
			{name: "bad ttft field", ttft: proto.Float64(0), code: codes.InvalidArgument, names: "slo_ttft_ms"},
			{name: "bad itl field", itl: proto.Float64(math.Inf(1)), code: codes.InvalidArgument, names: "slo_itl_ms"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				before := e.b.SLOAttainment(model, dispatch.RouteRegular)
				ctx := metadata.AppendToOutgoingContext(t.Context(), tt.md...)
				stream, err := e.client.Chat(ctx, &switchyardv1.ChatRequest{Model: model, Messages: user("x"), SloTtftMs: tt.ttft, SloItlMs: tt.itl})
				if err != nil {
					t.Fatal(err)
				}
				r := readAll(stream)
				if status.Code(r.err) != tt.code {
					t.Fatalf("got %v, want %s", r.err, tt.code)
				}
				if tt.code != codes.OK && !strings.Contains(status.Convert(r.err).Message(), tt.names) {
					t.Fatalf("error %v does not name %s", r.err, tt.names)
				}
				after := e.b.SLOAttainment(model, dispatch.RouteRegular)
				if counted := after.Met+after.Missed > before.Met+before.Missed; counted != tt.wantCounts {
					t.Fatalf("attainment %+v -> %+v: counted %v, want %v", before, after, counted, tt.wantCounts)
				}
			})
		}
	})

	t.Run("health", func(t *testing.T) {
		hc := healthpb.NewHealthClient(e.conn)
		for _, svc := range []string{"", "switchyard.v1.Switchyard"} {
			resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("service %q: %v %v, want SERVING", svc, resp, err)
			}
		}
	})

	t.Run("reflection", func(t *testing.T) {
		rc, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := rc.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		for _, want := range []string{"switchyard.v1.Switchyard", "grpc.health.v1.Health"} {
			if !slices.Contains(names, want) {
				t.Errorf("services %v lack %s", names, want)
			}
		}
	})
}

func TestUnavailableWhenAgentGone(t *testing.T) {
	e := newEnv(t, broker.Config{}, fast())
	// The stopped agent's last heartbeat says draining: the model stays
	// known (not 404) but has no eligible agent.
	e.stopAgent()
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if m := e.b.Models(); len(m) != 0 {
			return fmt.Errorf("models %v, want none", m)
		}
		return nil
	})
	stream, err := e.client.Chat(t.Context(), &switchyardv1.ChatRequest{Model: model, Messages: user("x")})
	if err != nil {
		t.Fatal(err)
	}
	if r := readAll(stream); status.Code(r.err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", r.err)
	}
}

// slow returns a simulator whose requests outlast the tests' deadlines.
func slow(slots int) simengine.Config {
	return simengine.Config{TTFT: time.Millisecond, ITL: 50 * time.Millisecond, Slots: slots}
}

var long = &switchyardv1.ChatRequest{Model: model, Messages: user("a long story"), MaxTokens: proto.Uint32(1000)}

// abortedAbove waits until the engine has aborted more than n requests.
func (e *env) abortedAbove(t *testing.T, n int64) {
	t.Helper()
	testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := e.eng.Aborted(); got <= n {
			return fmt.Errorf("engine aborted %d requests, want more than %d", got, n)
		}
		return nil
	})
}

func TestDeadline(t *testing.T) {
	// Each deadline must fall in the middle of a stream, after the engine
	// has begun it: 200ms and 500ms ones passed before the first token on a
	// busy machine, and the engine had nothing to abort. At 200ms a token,
	// long's stream (some 40 tokens) outlasts a 2s deadline four times.
	const deadline = 2 * time.Second
	cfg := slow(4)
	cfg.ITL = 200 * time.Millisecond
	e := newEnv(t, broker.Config{RequestTimeout: deadline}, cfg)

	t.Run("client deadline", func(t *testing.T) {
		before := e.eng.Aborted()
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		stream, err := e.client.Chat(ctx, long)
		if err != nil {
			t.Fatal(err)
		}
		r := readAll(stream)
		if status.Code(r.err) != codes.DeadlineExceeded {
			t.Fatalf("got %v, want DeadlineExceeded", r.err)
		}
		if len(r.deltas) == 0 {
			t.Error("no tokens before the deadline")
		}
		// The deadline reached the engine: its request ends too.
		e.abortedAbove(t, before)
	})

	t.Run("broker request timeout", func(t *testing.T) {
		before := e.eng.Aborted()
		stream, err := e.client.Chat(t.Context(), long)
		if err != nil {
			t.Fatal(err)
		}
		r := readAll(stream)
		if status.Code(r.err) != codes.DeadlineExceeded {
			t.Fatalf("got %v, want DeadlineExceeded from the server", r.err)
		}
		e.abortedAbove(t, before)
	})
}

func TestCancel(t *testing.T) {
	e := newEnv(t, broker.Config{}, slow(4))
	before := e.eng.Aborted()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := e.client.Chat(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetDelta() != nil {
			break
		}
	}
	cancel()
	// Messages already received may come first.
	if r := readAll(stream); status.Code(r.err) != codes.Canceled {
		t.Fatalf("got %v, want Canceled", r.err)
	}
	// The handler's Close cancels the engine request.
	e.abortedAbove(t, before)
}

func TestQueueFull(t *testing.T) {
	e := newEnv(t, broker.Config{QueueMax: 1}, slow(1))

	// Occupy the agent's only slot.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	busy, err := e.client.Chat(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := busy.Recv(); err != nil || msg.GetStart() == nil {
		t.Fatalf("first message %v %v, want start", msg, err)
	}
	// One more job fits in the queue; submit until one does not.
	errs := make(chan error, 16)
	for i := 0; ; i++ {
		if i == cap(errs) {
			t.Fatal("queue never filled")
		}
		stream, err := e.client.Chat(ctx, long)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := stream.Recv()
			errs <- err
		}()
		select {
		case err := <-errs:
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("got %v, want ResourceExhausted", err)
			}
			return
		case <-time.After(100 * time.Millisecond):
			// Queued (or still being submitted): try another.
		}
	}
}
