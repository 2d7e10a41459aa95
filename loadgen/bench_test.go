package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/switchyard-ai/switchyard/oaiformat/sse"
)

// chatTranscript is a vLLM-shaped chat stream of n tokens.
func chatTranscript(n int) []byte {
	var b bytes.Buffer
	head := `data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[`
	b.WriteString(head + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	for i := range n {
		fmt.Fprintf(&b, `%s{"index":0,"delta":{"content":" word%d"},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n", head, i)
	}
	fmt.Fprintf(&b, `%s],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", head, n, n+10)
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// BenchmarkStreamParse measures the client's per-event cost once bytes
// are in memory: SSE framing plus classification.
func BenchmarkStreamParse(b *testing.B) {
	const tokens = 256
	tr := chatTranscript(tokens)
	rd := bytes.NewReader(tr)
	s := sse.NewReader(rd, maxEvent)
	b.ReportAllocs()
	b.SetBytes(int64(len(tr)))
	for b.Loop() {
		rd.Reset(tr)
		s.Reset(rd, maxEvent)
		for {
			e, err := s.Next()
			if err != nil || string(e.Data) == "[DONE]" {
				break
			}
			scanEvent(e.Data)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(tokens+3)), "ns/event")
}

// BenchmarkRun drives an in-process server that writes and flushes one
// chunk per token as fast as it can, so client and server share the CPU;
// compare output_tok/s with the server alone to see the client's share.
func BenchmarkRun(b *testing.B) {
	const tokens = 64
	lines := bytes.SplitAfter(chatTranscript(tokens), []byte("\n\n"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, l := range lines {
			_, _ = w.Write(l)
			_ = rc.Flush()
		}
	}))
	defer srv.Close()
	for _, conc := range []int{16, 256} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			cfg := Config{URL: srv.URL, Model: "m", Concurrency: conc, Requests: 4 * conc,
				PromptTokens: Fixed(16), MaxTokens: Fixed(tokens)}
			var toks float64
			var itl Summary
			b.ReportAllocs()
			for b.Loop() {
				rep, err := Run(context.Background(), cfg)
				if err != nil || rep.Completed != cfg.Requests {
					b.Fatalf("%v %+v", err, rep)
				}
				toks += float64(rep.OutputTokens)
				itl = rep.ITL
			}
			b.ReportMetric(toks/b.Elapsed().Seconds(), "output_tok/s")
			b.ReportMetric(itl.P50*1000, "itl_p50_us")
			b.ReportMetric(itl.P99*1000, "itl_p99_us")
		})
	}
}
