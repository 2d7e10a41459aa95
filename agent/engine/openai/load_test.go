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
		{"vllm as prometheus_client writes it", `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 100.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.3
`, agent.Load{Running: 3, Waiting: 5, KVCacheUsage: 0.75, PrefixQueries: 400, PrefixHits: 40, HasPrefix: true}},
		{"sglang with labels and a timestamp", `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 7.0 1712345678000
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
`, agent.Load{Running: 7, Waiting: 1, KVCacheUsage: 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLoad(strings.NewReader(tc.in))
			if err != nil || got != tc.want {
				t.Fatalf("ParseLoad = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// An exposition with no load gauge, or none at all, is an error.
func TestParseLoadErrors(t *testing.T) {
	for _, in := range []string{
		"process_cpu_seconds_total 3\n",
		"vllm:num_requests_running{model_name=\"m\" 3\n",
		"vllm:num_requests_running three\n",
	} {
		if got, err := ParseLoad(strings.NewReader(in)); err == nil {
			t.Errorf("ParseLoad(%q) = %+v, want an error", in, got)
		}
	}
}
