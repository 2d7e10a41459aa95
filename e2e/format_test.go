package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/agent"
	oaengine "github.com/switchyard-ai/switchyard/agent/engine/openai"
	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// spyRequest is one request a spy engine received.
type spyRequest struct {
	Path   string
	Header http.Header
	Body   map[string]json.RawMessage
}

// spyEngine is an OpenAI-compatible engine that records the path, headers
// and body of every request and answers with a fixed stream: a role
// chunk, "Hello", " world" (an event whose data spans three lines, as a
// server that pretty-prints may send it), a finish chunk and a usage chunk
// with token details. A request with "stream": false (vLLM's prefill leg)
// gets one JSON answer with kv_transfer_params.
type spyEngine struct {
	URL  string
	mu   sync.Mutex
	reqs []spyRequest
	// reasoning makes the spy stream three reasoning chunks and then hang
	// until the request ends, as an engine whose agent is lost mid-thought.
	reasoning bool
}

const spyModel = "spy-model"

// spyKV is what the spy answers a prefill leg with; a decode leg must
// carry it unchanged.
const spyKV = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"spy-prefill","remote_block_ids":[1,2],"remote_host":"10.1.2.3","remote_port":5600}`

func startSpy(t testing.TB) *spyEngine {
	t.Helper()
	s := &spyEngine{}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		// A hanging stream (reasoning) ends when its connection does.
		srv.CloseClientConnections()
		srv.Close()
	})
	s.URL = srv.URL
	return s
}

func (s *spyEngine) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/models":
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"`+spyModel+`","object":"model"}]}`)
		return
	case "/v1/chat/completions", "/v1/completions":
	default:
		http.NotFound(w, r)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, spyRequest{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	s.mu.Unlock()
	if string(body["stream"]) != "true" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"chatcmpl-prefill","object":"chat.completion","created":1,"model":"`+spyModel+`",`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"H"},"finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8},"kv_transfer_params":`+spyKV+`}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	head := `"id":"chatcmpl-spy","object":"chat.completion.chunk","created":1,"model":"` + spyModel + `"`
	if s.reasoning {
		for _, ev := range []string{
			`data: {` + head + `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
			`data: {` + head + `,"choices":[{"index":0,"delta":{"reasoning_content":"Let"},"finish_reason":null}]}`,
			`data: {` + head + `,"choices":[{"index":0,"delta":{"reasoning_content":" me"},"finish_reason":null}]}`,
			`data: {` + head + `,"choices":[{"index":0,"delta":{"reasoning_content":" think"},"finish_reason":null}]}`,
		} {
			_, _ = io.WriteString(w, ev+"\n\n")
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	for _, ev := range []string{
		`data: {` + head + `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`data: {` + head + `,"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`,
		"data: {" + head + ",\ndata:   \"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\ndata: \"finish_reason\":null}]}",
		`data: {` + head + `,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`data: {` + head + `,"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9,` +
			`"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":1}}}`,
		`data: [DONE]`,
	} {
		_, _ = io.WriteString(w, ev+"\n\n")
	}
}

func (s *spyEngine) requests() []spyRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]spyRequest(nil), s.reqs...)
}

func (s *spyEngine) last(t testing.TB) spyRequest {
	t.Helper()
	r := s.requests()
	if len(r) == 0 {
		t.Fatal("the spy engine got no request")
	}
	return r[len(r)-1]
}

// startSpyAgent runs an agent in front of a spy engine.
func startSpyAgent(t testing.TB, natsURL, id string, s *spyEngine, args ...string) {
	t.Helper()
	base := []string{"--nats-url", natsURL, "--engine", "openai", "--engine-url", s.URL, "--id", id,
		"--slots", "4", "--heartbeat", liveHeartbeat, "--log-level", "warn"}
	cmdtest.Start(t, agentcmd.Run, append(base, args...)...)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     spyModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		MaxTokens: openai.Int(8),
	}
}

const (
	traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tracestate  = "congo=t61rcWkgMzE"
)

// TestSpyEngine drives a real broker and agent in front of a spy engine
// with the official SDK and checks what reaches the engine and what comes
// back.
func TestSpyEngine(t *testing.T) {
	b := cmdtest.StartBroker(t)
	spy := startSpy(t)
	startSpyAgent(t, b.NATS, "spy-a", spy)
	cmdtest.WaitEligible(t, b.HTTP, "spy-a")
	client := sdk(b.HTTP)
	ctx := context.Background()

	t.Run("hand-off fields refused over HTTP", func(t *testing.T) {
		for _, tc := range []struct {
			name, field string
			value       any
		}{
			{"kv_transfer_params", "kv_transfer_params", map[string]any{"do_remote_prefill": true, "remote_host": "10.9.9.9", "remote_port": 5600}},
			{"bootstrap_host", "bootstrap_host", "10.9.9.9"},
			{"bootstrap_port", "bootstrap_port", 8998},
			{"bootstrap_room", "bootstrap_room", 42},
			{"bootstrap_pair_key", "bootstrap_pair_key", "k"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := len(spy.requests())
				_, err := client.Chat.Completions.New(ctx, chatParams(), option.WithJSONSet(tc.field, tc.value))
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("error %v, want an API error", err)
				}
				if apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != tc.field || !strings.Contains(apiErr.Message, tc.field) {
					t.Fatalf("error %d param %q message %q, want 400 naming %s", apiErr.StatusCode, apiErr.Param, apiErr.Message, tc.field)
				}
				if n := len(spy.requests()); n != before {
					t.Fatalf("the engine got %d requests for a refused one", n-before)
				}
			})
		}
	})

	t.Run("hand-off fields refused over gRPC", func(t *testing.T) {
		gc := grpcClient(t, b.GRPC)
		for _, field := range []string{"kv_transfer_params", "bootstrap_host", "bootstrap_room"} {
			t.Run(field, func(t *testing.T) {
				before := len(spy.requests())
				st, err := gc.Chat(ctx, &switchyardv1.ChatRequest{
					Model:     spyModel,
					Messages:  []*switchyardv1.Message{{Role: "user", Content: "hi"}},
					ExtraJson: fmt.Sprintf(`{%q:{"remote_host":"10.9.9.9"}}`, field),
				})
				if err == nil {
					_, err = st.Recv()
				}
				if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), field) {
					t.Fatalf("status %v, want INVALID_ARGUMENT naming %s", err, field)
				}
				if n := len(spy.requests()); n != before {
					t.Fatalf("the engine got %d requests for a refused one", n-before)
				}
			})
		}
	})

	t.Run("request id and trace context reach the engine", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, chatParams(),
			option.WithHeader("X-Request-Id", "client-req-1"),
			option.WithHeader("traceparent", traceparent),
			option.WithHeader("tracestate", tracestate))
		if err != nil {
			t.Fatal(err)
		}
		h := spy.last(t).Header
		if h.Get("X-Request-Id") != "client-req-1" || h.Get("Traceparent") != traceparent || h.Get("Tracestate") != tracestate {
			t.Fatalf("engine headers: X-Request-Id %q traceparent %q tracestate %q", h.Get("X-Request-Id"), h.Get("Traceparent"), h.Get("Tracestate"))
		}
		// Without a client id the engine gets the id the client was told.
		var resp *http.Response
		if _, err := client.Chat.Completions.New(ctx, chatParams(), option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		if got, want := spy.last(t).Header.Get("X-Request-Id"), resp.Header.Get("X-Request-Id"); got == "" || got != want {
			t.Fatalf("engine X-Request-Id %q, client's %q", got, want)
		}
	})

	t.Run("request id and trace context over gRPC", func(t *testing.T) {
		gc := grpcClient(t, b.GRPC)
		md := metadata.Pairs("x-request-id", "grpc-req-1", "traceparent", traceparent)
		st, err := gc.Chat(metadata.NewOutgoingContext(ctx, md), &switchyardv1.ChatRequest{
			Model: spyModel, Messages: []*switchyardv1.Message{{Role: "user", Content: "hi"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if r := readGRPC(t, st); r.text != "Hello world" {
			t.Fatalf("text %q", r.text)
		}
		h := spy.last(t).Header
		if h.Get("X-Request-Id") != "grpc-req-1" || h.Get("Traceparent") != traceparent {
			t.Fatalf("engine headers: X-Request-Id %q traceparent %q", h.Get("X-Request-Id"), h.Get("Traceparent"))
		}
	})

	t.Run("stream_options merged", func(t *testing.T) {
		p := chatParams()
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, p, option.WithJSONSet("stream_options.continuous_usage_stats", true))
		for stream.Next() {
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		var so map[string]any
		if err := json.Unmarshal(spy.last(t).Body["stream_options"], &so); err != nil {
			t.Fatal(err)
		}
		if so["include_usage"] != true || so["continuous_usage_stats"] != true || len(so) != 2 {
			t.Fatalf("engine stream_options %v", so)
		}
	})

	t.Run("usage members kept", func(t *testing.T) {
		got, err := client.Chat.Completions.New(ctx, chatParams())
		if err != nil {
			t.Fatal(err)
		}
		u := got.Usage
		if u.PromptTokens != 7 || u.CompletionTokens != 2 || u.TotalTokens != 9 ||
			u.PromptTokensDetails.CachedTokens != 3 || u.CompletionTokensDetails.ReasoningTokens != 1 {
			t.Fatalf("usage %s", u.RawJSON())
		}
		if got.Choices[0].Message.Content != "Hello world" {
			t.Fatalf("content %q", got.Choices[0].Message.Content)
		}
	})

	t.Run("multi-line SSE data", func(t *testing.T) {
		p := chatParams()
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if c := acc.Choices[0].Message.Content; c != "Hello world" {
			t.Fatalf("streamed content %q, want the multi-line event's text too", c)
		}
		if acc.Usage.CompletionTokensDetails.ReasoningTokens != 1 {
			t.Fatalf("streamed usage %s", acc.Usage.RawJSON())
		}
	})
}

// TestSpyVLLMPD runs a vLLM PD pair of spies behind real prefill and decode
// agents: the legs must be the ones vLLM's own proxy sends.
func TestSpyVLLMPD(t *testing.T) {
	b := cmdtest.StartBroker(t)
	pre, dec := startSpy(t), startSpy(t)
	startSpyAgent(t, b.NATS, "spy-pre", pre, "--engine", "vllm", "--role", "prefill")
	startSpyAgent(t, b.NATS, "spy-dec", dec, "--engine", "vllm", "--role", "decode")
	cmdtest.WaitEligible(t, b.HTTP, "spy-pre", "spy-dec")
	client := sdk(b.HTTP)

	var resp *http.Response
	got, err := client.Chat.Completions.New(context.Background(), chatParams(),
		option.WithJSONSet("min_tokens", 2), option.WithJSONSet("max_completion_tokens", 8),
		option.WithHeader("X-Request-Id", "pd-req-1"), option.WithHeader("traceparent", traceparent),
		option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Header.Get("X-Switchyard-Route"); r != "pd" {
		t.Fatalf("route %q", r)
	}
	if got.Choices[0].Message.Content != "Hello world" {
		t.Fatalf("content %q", got.Choices[0].Message.Content)
	}
	p, d := pre.requests(), dec.requests()
	if len(p) != 1 || len(d) != 1 {
		t.Fatalf("%d prefill and %d decode requests, want one each", len(p), len(d))
	}
	pb, db := p[0].Body, d[0].Body
	for _, tc := range []struct {
		name      string
		body      map[string]json.RawMessage
		key, want string // want "" means absent
	}{
		{"prefill max_tokens", pb, "max_tokens", "1"},
		{"prefill max_completion_tokens", pb, "max_completion_tokens", "1"},
		{"prefill stream", pb, "stream", "false"},
		{"prefill stream_options", pb, "stream_options", ""},
		{"prefill min_tokens", pb, "min_tokens", ""},
		{"decode max_tokens", db, "max_tokens", "8"},
		{"decode max_completion_tokens", db, "max_completion_tokens", "8"},
		{"decode min_tokens", db, "min_tokens", "2"},
		{"decode stream", db, "stream", "true"},
		{"decode kv_transfer_params", db, "kv_transfer_params", spyKV},
	} {
		if v, ok := tc.body[tc.key]; (tc.want == "" && ok) || (tc.want != "" && string(v) != tc.want) {
			t.Errorf("%s: %s = %s, want %q", tc.name, tc.key, v, tc.want)
		}
	}
	var kv map[string]any
	if err := json.Unmarshal(pb["kv_transfer_params"], &kv); err != nil || kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false {
		t.Errorf("prefill kv_transfer_params %s", pb["kv_transfer_params"])
	}
	for _, leg := range []spyRequest{p[0], d[0]} {
		if id, tp := leg.Header.Get("X-Request-Id"), leg.Header.Get("Traceparent"); id != "pd-req-1" || tp != traceparent {
			t.Errorf("%s leg: X-Request-Id %q traceparent %q", leg.Path, id, tp)
		}
	}
}

// TestSpyReasoningNotRestarted: an agent lost while its engine streams
// reasoning_content is not migrated (the engines continue a message's
// content, not its reasoning), so the client never sees the reasoning
// start again: one clear error ends the stream, and the other agent's
// engine gets no request.
func TestSpyReasoningNotRestarted(t *testing.T) {
	b := cmdtest.StartBroker(t)
	thinking := startSpy(t)
	thinking.reasoning = true
	nc, err := nats.Connect(b.NATS)
	if err != nil {
		t.Fatal(err)
	}
	oa, err := oaengine.New(thinking.URL, 4)
	if err != nil {
		t.Fatal(err)
	}
	doomed, err := agent.New(nc, oa, agent.Config{ID: "doomed", Model: spyModel, Slots: 4, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = doomed.Run(ctx) }()
	cmdtest.WaitEligible(t, b.HTTP, "doomed")
	body := `{"model":"` + spyModel + `","messages":[{"role":"user","content":"think"}],"max_tokens":30,"stream":true}`
	resp, err := http.Post(b.HTTP+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := sseEvents(resp.Body)
	for reasoning := 0; reasoning < 3; {
		ev, ok := <-events
		if !ok {
			t.Fatal("stream ended before the reasoning")
		}
		if strings.Contains(ev, `"reasoning_content"`) {
			reasoning++
		}
	}
	// Another agent is there to take a migration, then the first is gone
	// mid-thought.
	survivor := startSpy(t)
	startSpyAgent(t, b.NATS, "survivor", survivor)
	cmdtest.WaitEligible(t, b.HTTP, "survivor")
	nc.Close()
	var rest []string
	for ev := range events {
		rest = append(rest, ev)
	}
	if len(rest) != 1 || !strings.Contains(rest[0], `"error"`) || !strings.Contains(rest[0], "reasoning") {
		t.Fatalf("after the loss the client got %q, want one error about reasoning", rest)
	}
	if n := len(survivor.requests()); n != 0 {
		t.Fatalf("the survivor's engine got %d requests: the reasoning would start again", n)
	}
}

// sseEvents sends the data of each SSE event read from r (lines joined
// with \n, as the SSE spec says) until r ends.
func sseEvents(r io.Reader) <-chan string {
	out := make(chan string, 64)
	go func() {
		defer close(out)
		br := bufio.NewReader(r)
		var data []string
		for {
			line, err := br.ReadString('\n')
			line = strings.TrimRight(line, "\r\n")
			if v, ok := strings.CutPrefix(line, "data:"); ok {
				data = append(data, strings.TrimPrefix(v, " "))
			} else if line == "" && len(data) > 0 {
				out <- strings.Join(data, "\n")
				data = nil
			}
			if err != nil {
				return
			}
		}
	}()
	return out
}
