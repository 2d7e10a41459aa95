package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/loadgen"
	"github.com/switchyard-ai/switchyard/simengine"
)

// BenchmarkOverhead measures what the broker path adds over calling the
// sim-engine directly: client -> broker -> JetStream -> agent -> engine and
// back over core NATS, against client -> engine. The engine has a 2ms ITL
// and no TTFT cost, so TTFT is pure path latency; each b.N is one request.
// Run with: go test -run '^$' -bench Overhead -benchtime 2000x ./e2e
func BenchmarkOverhead(b *testing.B) {
	for _, streams := range []int{1, 64} {
		eng := startEngine(b, simengine.Config{Model: model, ITL: 2 * time.Millisecond, Slots: 256})
		br := cmdtest.StartBroker(b, "--log-level", "error")
		startAgent(b, br.NATS, "bench-agent", eng, 256, "--log-level", "error")
		cmdtest.WaitEligible(b, br.HTTP, "bench-agent")
		for _, path := range []struct{ name, url string }{{"direct", eng.URL}, {"switchyard", br.HTTP}} {
			b.Run(fmt.Sprintf("path=%s/streams=%d", path.name, streams), func(b *testing.B) {
				cfg := loadgen.Config{
					URL: path.url, Model: model, Concurrency: streams,
					Requests: max(b.N, streams), WarmupRequests: streams,
					PromptTokens: loadgen.Fixed(16), MaxTokens: loadgen.Fixed(32), Timeout: time.Minute,
				}
				b.ResetTimer()
				rep, err := loadgen.Run(context.Background(), cfg)
				if err != nil {
					b.Fatal(err)
				}
				if rep.Completed != rep.Requests {
					b.Fatalf("%d of %d requests failed: %v", rep.Requests-rep.Completed, rep.Requests, rep.Errors)
				}
				b.ReportMetric(rep.TTFT.P50*1000, "ttft_p50_us")
				b.ReportMetric(rep.TTFT.P99*1000, "ttft_p99_us")
				b.ReportMetric(rep.ITL.P50*1000, "itl_p50_us")
				b.ReportMetric(rep.ITL.P99*1000, "itl_p99_us")
				b.ReportMetric(rep.OutputTokensPerS, "tokens/s")
			})
		}
	}
}
