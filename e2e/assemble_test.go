package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// vllmLikeEngine streams what vLLM sends for a chat request with n=2 and
// tools, or a completion with logprobs: two choices interleaved, reasoning,
// content with logprobs, tool calls in pieces, vLLM's stop_reason, a
// system_fingerprint, then the usage chunk.
func vllmLikeEngine(t *testing.T) *engine {
	chat := []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null},{"index":1,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":0,"delta":{"reasoning_content":"The user "},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":0,"delta":{"reasoning_content":"greets me."},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":{"content":[{"token":"Hello","logprob":-0.1,"bytes":[72,101,108,108,111],"top_logprobs":[]}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":0,"delta":{"content":" there"},"logprobs":{"content":[{"token":" there","logprob":-0.2,"bytes":[32,116,104,101,114,101],"top_logprobs":[]}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":1,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","system_fingerprint":"fp-1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":"</s>"},{"index":1,"delta":{},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"sim-model","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":11,"total_tokens":20}}`,
	}
	completion := []string{
		`{"id":"cmpl-1","object":"text_completion","created":8,"model":"sim-model","choices":[{"index":0,"text":"Once","logprobs":{"text_offset":[5],"token_logprobs":[-0.5],"tokens":["Once"],"top_logprobs":[{"Once":-0.5}]},"finish_reason":null}]}`,
		`{"id":"cmpl-1","object":"text_completion","created":8,"model":"sim-model","choices":[{"index":0,"text":" upon","logprobs":{"text_offset":[9],"token_logprobs":[-0.25],"tokens":[" upon"],"top_logprobs":[{" upon":-0.25}]},"finish_reason":"length","stop_reason":null}]}`,
		`{"id":"cmpl-1","object":"text_completion","created":8,"model":"sim-model","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`,
	}
	return scriptedEngine(t, func(w http.ResponseWriter, r *http.Request) {
		events := chat
		if strings.HasSuffix(r.URL.Path, "/completions") && !strings.Contains(r.URL.Path, "chat") {
			events = completion
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for _, e := range events {
			fmt.Fprintf(w, "data: %s\n\n", e)
			_ = rc.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
}

// TestNonStreamingKeepsEverything: a non-streaming answer assembled from
// the engine's stream keeps what a streaming client would have seen: every
// choice of n, reasoning, tool calls merged from their pieces, logprobs,
// vLLM's stop_reason and the system fingerprint; read back through the
// official SDK, and compared whole.
func TestNonStreamingKeepsEverything(t *testing.T) {
	b := cmdtest.StartBroker(t)
	startAgent(t, b.NATS, "a1", vllmLikeEngine(t), 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	ctx := context.Background()

	t.Run("chat", func(t *testing.T) {
		client := sdk(b.HTTP)
		got, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi, and the weather in Paris?")},
			N:        openai.Int(2),
			Logprobs: openai.Bool(true),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Choices) != 2 {
			t.Fatalf("%d choices, want 2: %s", len(got.Choices), got.RawJSON())
		}
		c0, c1 := got.Choices[0], got.Choices[1]
		if c0.Message.Content != "Hello there" || c0.FinishReason != "stop" {
			t.Errorf("choice 0: content %q finish %q", c0.Message.Content, c0.FinishReason)
		}
		if n := len(c0.Logprobs.Content); n != 2 || c0.Logprobs.Content[1].Token != " there" {
			t.Errorf("choice 0 logprobs: %s", c0.Logprobs.RawJSON())
		}
		if c1.FinishReason != "tool_calls" || len(c1.Message.ToolCalls) != 2 {
			t.Fatalf("choice 1: finish %q, tool calls %s", c1.FinishReason, c1.Message.RawJSON())
		}
		if tc := c1.Message.ToolCalls[0]; tc.ID != "call_a" || tc.Function.Name != "get_weather" || tc.Function.Arguments != `{"city": "Paris"}` {
			t.Errorf("tool call 0: %s", tc.RawJSON())
		}
		if tc := c1.Message.ToolCalls[1]; tc.ID != "call_b" || tc.Function.Name != "get_time" || tc.Function.Arguments != `{}` {
			t.Errorf("tool call 1: %s", tc.RawJSON())
		}
		if got.SystemFingerprint != "fp-1" || got.Usage.TotalTokens != 20 {
			t.Errorf("fingerprint %q, usage %s", got.SystemFingerprint, got.Usage.RawJSON())
		}
		// The whole document, members in order, as vLLM would have
		// answered it without streaming.
		want := `{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"sim-model","choices":[` +
			`{"index":0,"message":{"role":"assistant","content":"Hello there","reasoning_content":"The user greets me."},` +
			`"logprobs":{"content":[{"token":"Hello","logprob":-0.1,"bytes":[72,101,108,108,111],"top_logprobs":[]},{"token":" there","logprob":-0.2,"bytes":[32,116,104,101,114,101],"top_logprobs":[]}]},` +
			`"finish_reason":"stop","stop_reason":"</s>"},` +
			`{"index":1,"message":{"role":"assistant","content":null,"tool_calls":[` +
			`{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},` +
			`{"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]},` +
			`"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],` +
			`"usage":{"prompt_tokens":9,"completion_tokens":11,"total_tokens":20},"system_fingerprint":"fp-1"}`
		if raw := strings.TrimSpace(got.RawJSON()); raw != want {
			t.Errorf("response\n got %s\nwant %s", raw, want)
		}
	})

	t.Run("completion", func(t *testing.T) {
		resp, err := http.Post(b.HTTP+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"sim-model","prompt":"Tell","max_tokens":2,"logprobs":1}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		want := `{"id":"cmpl-1","object":"text_completion","created":8,"model":"sim-model","choices":[` +
			`{"index":0,"text":"Once upon","logprobs":{"text_offset":[5,9],"token_logprobs":[-0.5,-0.25],"tokens":["Once"," upon"],"top_logprobs":[{"Once":-0.5},{" upon":-0.25}]},` +
			`"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`
		var compact bytes.Buffer
		if err := json.Compact(&compact, body); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		if compact.String() != want {
			t.Errorf("response\n got %s\nwant %s", compact.String(), want)
		}
	})
}
