package simengine

import "github.com/prometheus/client_golang/prometheus"

// newRegistry registers the vLLM gauges that routers read, on a registry
// private to e so that engines in one process do not collide.
func newRegistry(e *Engine) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": e.cfg.Model}
	gauge := func(name, help string, f func(Load) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        name,
			Help:        help,
			ConstLabels: labels,
		}, func() float64 { return f(e.Load()) })
	}
	reg.MustRegister(
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
			func(l Load) float64 { return float64(l.Running) }),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
			func(l Load) float64 { return float64(l.Waiting) }),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
			func(l Load) float64 { return l.KVUsage }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "vllm:prefix_cache_queries_total",
			Help:        "Prefix cache queries, in terms of number of queried tokens.",
			ConstLabels: labels,
		}, func() float64 { q, _, _ := e.PrefixCache(); return float64(q) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "vllm:prefix_cache_hits_total",
			Help:        "Prefix cache hits, in terms of number of cached tokens.",
			ConstLabels: labels,
		}, func() float64 { _, h, _ := e.PrefixCache(); return float64(h) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchyard_sim_requests_aborted_total",
			Help:        "Requests ended early by cancellation or a failed write.",
			ConstLabels: labels,
		}, func() float64 { return float64(e.Aborted()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "switchyard_sim_pd_handoffs_held",
			Help:        "Hand-offs whose KV a prefill engine holds for a decode that has not read it yet.",
			ConstLabels: labels,
		}, func() float64 { h, _ := e.HeldKV(); return float64(h) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "switchyard_sim_pd_kv_held_blocks",
			Help:        "KV blocks (16 prompt tokens each) a prefill engine holds for decodes that have not read them yet.",
			ConstLabels: labels,
		}, func() float64 { _, b := e.HeldKV(); return float64(b) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchyard_sim_pd_handoffs_expired_total",
			Help:        "Hand-offs a prefill engine freed unread when the KV hold timeout passed.",
			ConstLabels: labels,
		}, func() float64 { return float64(e.HandoffsExpired()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchyard_sim_pd_handoffs_abandoned_total",
			Help:        "Hand-offs a prefill engine freed unread before the timeout because a leg was aborted.",
			ConstLabels: labels,
		}, func() float64 { return float64(e.HandoffsAbandoned()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "switchyard_sim_loaded",
			Help:        "1 once the engine has loaded (its health checks pass), else 0.",
			ConstLabels: labels,
		}, func() float64 {
			if e.Loaded() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchyard_sim_kv_transfer_failures_total",
			Help:        "Decode requests failed because their prefill hand-off failed.",
			ConstLabels: labels,
		}, func() float64 { return float64(e.KVTransferFailures()) }),
	)
	return reg
}
