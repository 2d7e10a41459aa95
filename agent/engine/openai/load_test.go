package openai

import (
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/agent"
)

func TestParseLoad(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     agent.Load
	}{
		{"vllm with prefix cache", `# HELP vllm:num_requests_running x
vllm:num_requests_running{model_name="m"} 3
vllm:num_requests_waiting{model_name="m"} 1
vllm:kv_cache_usage_perc{model_name="m"} 0.5
vllm:prefix_cache_queries_total{model_name="m"} 1000
vllm:prefix_cache_hits_total{model_name="m"} 750
`, agent.Load{Running: 3, Waiting: 1, KVCacheUsage: 0.5, PrefixQueries: 1000, PrefixHits: 750, HasPrefix: true}},
		{"no prefix counters", "vllm:num_requests_running 2\n", agent.Load{Running: 2}},
		{"sglang", "sglang:num_running_reqs 4\nsglang:num_queue_reqs 2\nsglang:token_usage 0.25\n", agent.Load{Running: 4, Waiting: 2, KVCacheUsage: 0.25}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLoad(strings.NewReader(tc.in))
			if err != nil || got != tc.want {
				t.Fatalf("ParseLoad = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
