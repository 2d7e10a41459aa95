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
			Name:        "switchyard_sim_requests_aborted_total",
			Help:        "Requests ended early by cancellation or a failed write.",
			ConstLabels: labels,
		}, func() float64 { return float64(e.Aborted()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchyard_sim_kv_transfer_failures_total",
			Help:        "Decode requests failed because their prefill hand-off failed.",
			ConstLabels: labels,
		}, func() float64 { return float64(e.KVTransferFailures()) }),
	)
	return reg
}
