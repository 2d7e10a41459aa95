package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/simengine"
)

const model = "sim-model"

func fastEngine(t testing.TB, slots int) *engine {
	return startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: slots})
}

func expect(t testing.TB, api simengine.API, body string) simengine.Expectation {
	t.Helper()
	e, err := simengine.Expect(api, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sdk(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// TestOpenAISDK drives chat and completions, streaming and not, through the
// official SDK and checks every byte of content and the usage against the
// simulator's deterministic output.
func TestOpenAISDK(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e1, e2 := fastEngine(t, 4), fastEngine(t, 4)
	startAgent(t, b.NATS, "a1", e1, 4)
	startAgent(t, b.NATS, "a2", e2, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")
	client := sdk(b.HTTP)
	ctx := context.Background()

	t.Run("chat", func(t *testing.T) {
		want := expect(t, simengine.APIChat, `{"messages":[{"role":"user","content":"tell me about trains"}],"max_tokens":12}`)
		var resp *http.Response
		got, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     model,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me about trains")},
			MaxTokens: openai.Int(12),
		}, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if c := got.Choices[0].Message.Content; c != want.Text {
			t.Fatalf("content %q, want %q", c, want.Text)
		}
		if got.Choices[0].FinishReason != want.FinishReason {
			t.Fatalf("finish %q, want %q", got.Choices[0].FinishReason, want.FinishReason)
		}
		if got.Usage.PromptTokens != int64(want.PromptTokens) || got.Usage.CompletionTokens != int64(want.CompletionTokens) || got.Usage.TotalTokens != int64(want.PromptTokens+want.CompletionTokens) {
			t.Fatalf("usage %+v, want %d+%d", got.Usage, want.PromptTokens, want.CompletionTokens)
		}
		if r := resp.Header.Get("X-Switchyard-Route"); r != "regular" {
			t.Fatalf("route header %q", r)
		}
		if a := resp.Header.Get("X-Switchyard-Agent"); a != "a1" && a != "a2" {
			t.Fatalf("agent header %q", a)
		}
	})

	t.Run("chat stream", func(t *testing.T) {
		want := expect(t, simengine.APIChat, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"why NATS"}],"stream":true,"stream_options":{"include_usage":true}}`)
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: model,
			Messages: []openai.ChatCompletionMessageParamUnion{
				openai.SystemMessage("be brief"), openai.UserMessage("why NATS"),
			},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var acc openai.ChatCompletionAccumulator
		usageChunks := 0
		for stream.Next() {
			c := stream.Current()
			acc.AddChunk(c)
			if len(c.Choices) == 0 && c.Usage.TotalTokens > 0 {
				usageChunks++
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if c := acc.Choices[0].Message.Content; c != want.Text {
			t.Fatalf("content %q, want %q", c, want.Text)
		}
		if usageChunks != 1 || acc.Usage.CompletionTokens != int64(want.CompletionTokens) || acc.Usage.PromptTokens != int64(want.PromptTokens) {
			t.Fatalf("usage chunks %d usage %+v, want %d+%d", usageChunks, acc.Usage, want.PromptTokens, want.CompletionTokens)
		}
	})

	t.Run("chat stream without usage", func(t *testing.T) {
		want := expect(t, simengine.APIChat, `{"messages":[{"role":"user","content":"no usage please"}],"max_tokens":7,"stream":true}`)
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:     model,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("no usage please")},
			MaxTokens: openai.Int(7),
		})
		var text strings.Builder
		for stream.Next() {
			c := stream.Current()
			if len(c.Choices) == 0 {
				t.Fatalf("usage chunk sent although not asked for: %s", c.RawJSON())
			}
			text.WriteString(c.Choices[0].Delta.Content)
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != want.Text {
			t.Fatalf("content %q, want %q", text.String(), want.Text)
		}
	})

	t.Run("completion", func(t *testing.T) {
		want := expect(t, simengine.APICompletion, `{"prompt":"once upon a time","max_tokens":9}`)
		got, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     model,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
			MaxTokens: openai.Int(9),
		})
		if err != nil {
			t.Fatal(err)
		}
		if got.Choices[0].Text != want.Text || string(got.Choices[0].FinishReason) != want.FinishReason {
			t.Fatalf("text %q finish %q, want %q %q", got.Choices[0].Text, got.Choices[0].FinishReason, want.Text, want.FinishReason)
		}
		if got.Usage.CompletionTokens != int64(want.CompletionTokens) || got.Usage.PromptTokens != int64(want.PromptTokens) {
			t.Fatalf("usage %+v", got.Usage)
		}
	})

	t.Run("completion stream", func(t *testing.T) {
		want := expect(t, simengine.APICompletion, `{"prompt":"the broker said","stream":true,"stream_options":{"include_usage":true}}`)
		stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         model,
			Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("the broker said")},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text strings.Builder
		var completion int64
		finish := ""
		for stream.Next() {
			c := stream.Current()
			for _, ch := range c.Choices {
				text.WriteString(ch.Text)
				if ch.FinishReason != "" {
					finish = string(ch.FinishReason)
				}
			}
			if c.Usage.CompletionTokens > 0 {
				completion = c.Usage.CompletionTokens
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != want.Text || finish != want.FinishReason || completion != int64(want.CompletionTokens) {
			t.Fatalf("text %q finish %q tokens %d, want %q %q %d", text.String(), finish, completion, want.Text, want.FinishReason, want.CompletionTokens)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != model {
			t.Fatalf("models %+v", page.Data)
		}
	})
}

// streamResult is what one raw SSE client saw.
type streamResult struct {
	text   string
	agent  string
	route  string
	done   bool
	status int
	errMsg string
}

// rawStream posts a streaming chat request and reads the SSE by hand, so the
// test sees exactly what went over the wire.
func rawStream(ctx context.Context, base, prompt string, maxTokens int) (streamResult, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return streamResult{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamResult{}, err
	}
	defer resp.Body.Close()
	r := streamResult{status: resp.StatusCode, agent: resp.Header.Get("X-Switchyard-Agent"), route: resp.Header.Get("X-Switchyard-Route")}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	if resp.StatusCode != http.StatusOK {
		r.errMsg = string(data)
		return r, nil
	}
	var text strings.Builder
	for _, ev := range strings.Split(string(data), "\n\n") {
		ev = strings.TrimSpace(ev)
		if ev == "" {
			continue
		}
		payload, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			return r, fmt.Errorf("not an SSE data event: %q", ev)
		}
		if payload == "[DONE]" {
			r.done = true
			continue
		}
		if r.done {
			return r, fmt.Errorf("event after [DONE]: %q", payload)
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			return r, err
		}
		if c.Error != nil {
			r.errMsg = c.Error.Message
			continue
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	r.text = text.String()
	return r, nil
}

// heartbeatPeaks records the highest active count each agent reported.
type heartbeatPeaks struct {
	mu    sync.Mutex
	peak  map[string]int
	slots map[string]int
}

// Test64Streams: 64 concurrent streams over two 4-slot agents. Each client
// gets exactly its own tokens in order; no engine ever runs more requests
// than its agent's slots; both agents work.
func Test64Streams(t *testing.T) {
	b := cmdtest.StartBroker(t)
	const slots = 4
	e1 := startEngine(t, simengine.Config{Model: model, TTFT: 2 * time.Millisecond, ITL: time.Millisecond, Slots: 16})
	e2 := startEngine(t, simengine.Config{Model: model, TTFT: 2 * time.Millisecond, ITL: time.Millisecond, Slots: 16})
	startAgent(t, b.NATS, "a1", e1, slots)
	startAgent(t, b.NATS, "a2", e2, slots)
	cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")
	peaks := watchHeartbeats(t, b.NATS)

	const n = 64
	results := make([]streamResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = rawStream(context.Background(), b.HTTP, fmt.Sprintf("stream number %d wants its own words", i), 24)
		}()
	}
	wg.Wait()
	byAgent := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("stream %d: %v", i, errs[i])
		}
		r := results[i]
		want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":24}`, fmt.Sprintf("stream number %d wants its own words", i)))
		if r.status != http.StatusOK || !r.done || r.errMsg != "" {
			t.Fatalf("stream %d: status %d done %v err %q", i, r.status, r.done, r.errMsg)
		}
		if r.text != want.Text {
			t.Fatalf("stream %d got %q, want %q", i, r.text, want.Text)
		}
		byAgent[r.agent]++
	}
	if byAgent["a1"] == 0 || byAgent["a2"] == 0 || byAgent["a1"]+byAgent["a2"] != n {
		t.Fatalf("work split %v: both agents must serve", byAgent)
	}
	for _, e := range []*engine{e1, e2} {
		if p := e.peak.Load(); p > slots {
			t.Fatalf("engine ran %d requests at once, agent slots %d", p, slots)
		}
	}
	peaks.mu.Lock()
	defer peaks.mu.Unlock()
	for id, p := range peaks.peak {
		if p > peaks.slots[id] {
			t.Fatalf("agent %s reported %d active, slots %d", id, p, peaks.slots[id])
		}
	}
	t.Logf("split %v; engine peaks %d %d; heartbeat peaks %v", byAgent, e1.peak.Load(), e2.peak.Load(), peaks.peak)
}
