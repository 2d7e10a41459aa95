package openai

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// BenchmarkStream: one engine call on a kept-alive connection, to the end
// of a short streamed answer (three events and [DONE]).
func BenchmarkStream(b *testing.B) {
	const sse = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" hi\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: [DONE]\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sse)
	}))
	defer srv.Close()
	a, err := New(srv.URL, 1)
	if err != nil {
		b.Fatal(err)
	}
	req := &agent.Request{API: wire.API_API_CHAT, Body: []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`)}
	emit := func([]byte, bool) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := a.Stream(context.Background(), req, emit); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadSSE: reading a 64-event answer already in memory.
func BenchmarkReadSSE(b *testing.B) {
	body := strings.Repeat("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"}}]}\n\n", 64) + "data: [DONE]\n\n"
	emit := func([]byte, bool) error { return nil }
	r := strings.NewReader(body)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r.Reset(body)
		if err := ReadSSE(r, emit); err != nil {
			b.Fatal(err)
		}
	}
}
