package loadgen

import (
	"testing"
)

func TestScanEvent(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want event
	}{
		{"chat role chunk", `{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}`, event{}},
		{"chat token", `{"id":"c","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`, event{content: true}},
		{"escaped quote token", `{"choices":[{"delta":{"content":"\"q"}}]}`, event{content: true}},
		{"spaced token", `{"choices": [{"delta": {"content" : "a"}}]}`, event{content: true}},
		{"null content", `{"choices":[{"delta":{"content":null}}]}`, event{}},
		{"reasoning", `{"choices":[{"delta":{"reasoning_content":"think"}}]}`, event{content: true}},
		{"completion token", `{"id":"x","object":"text_completion","choices":[{"index":0,"text":" w","finish_reason":null}]}`, event{content: true}},
		{"completion finish", `{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":null}`, event{}},
		{"value looks like a key", `{"choices":[{"delta":{"content":"content"}}]}`, event{content: true}},
		{"value named text then colon-free", `{"x":"text","y":""}`, event{}},
		{"logprobs content array", `{"choices":[{"delta":{"content":""},"logprobs":{"content":[{"token":"a"}]}}]}`, event{}},
		{"usage", `{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`, event{usage: true, promptTokens: 12, outTokens: 34}},
		{"error event", `{"error":{"message":"kv transfer failed","type":"x","code":"kv_transfer_failed"}}`, event{err: true}},
		{"null error", `{"error":null,"choices":[{"delta":{"content":"a"}}]}`, event{content: true}},
		{"truncated key", `{"choices":[{"delta":{"conte`, event{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := scanEvent([]byte(tc.in)); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
