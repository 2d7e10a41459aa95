package openaihttp

import (
	"net/http"
	"testing"
)

func TestAppendEvent(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"one line", `{"a":1}`, "data: {\"a\":1}\n\n"},
		{"lines", "{\"a\":\n1}", "data: {\"a\":\ndata: 1}\n\n"},
		{"crlf and cr", "a\r\nb\rc", "data: a\ndata: b\ndata: c\n\n"},
		{"trailing newline", "a\n", "data: a\ndata: \n\n"},
		{"done", "[DONE]", "data: [DONE]\n\n"},
		{"cr after lf", "a\nb\rc", "data: a\ndata: b\ndata: c\n\n"},
		{"lf cr", "a\n\rb", "data: a\ndata: \ndata: b\n\n"},
		{"empty", "", "data: \n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(appendEvent(nil, []byte(tc.data))); got != tc.want {
				t.Errorf("appendEvent(%q) = %q, want %q", tc.data, got, tc.want)
			}
		})
	}
}

func BenchmarkAppendEvent(b *testing.B) {
	raw := []byte(`{"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764750000,"model":"sim-model","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendEvent(buf[:0], raw)
	}
}

// headerWriter is a ResponseWriter that keeps only its header.
type headerWriter struct {
	h      http.Header
	status int
}
