package openaihttp

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/switchyard-ai/switchyard/dispatch"
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

func (w *headerWriter) Header() http.Header         { return w.h }
func (w *headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerWriter) WriteHeader(status int)      { w.status = status }

// TestStreamHeadAllocs: a stream's head (its SSE headers and its route)
// makes no allocation of its own: the values are made once.
func TestStreamHeadAllocs(t *testing.T) {
	w := &headerWriter{h: make(http.Header, 8)}
	allocs := testing.AllocsPerRun(100, func() {
		clear(w.h)
		setRoute(w.h, dispatch.RoutePD)
		h := sseHead{w: w}
		h.start()
	})
	if allocs != 0 {
		t.Fatalf("a stream's head: %.1f allocations, want 0", allocs)
	}
	want := http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-cache"}, "X-Accel-Buffering": {"no"}, "X-Switchyard-Route": {"pd"}}
	if !reflect.DeepEqual(w.h, want) || w.status != http.StatusOK {
		t.Fatalf("head %d %v, want 200 %v", w.status, w.h, want)
	}
	setRoute(w.h, dispatch.Route(7))
	if got := w.h.Get("X-Switchyard-Route"); got != "Route(7)" {
		t.Fatalf("an unknown route's header %q", got)
	}
}
