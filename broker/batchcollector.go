package broker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// batchDescs are the gauges of batch-class work per pool, which the fleet
// collector exposes beside its own.
type batchDescs struct {
	queued, running, share *prometheus.Desc
}

func newBatchDescs() batchDescs {
	mp := []string{"model", "pool"}
	return batchDescs{
		queued: prometheus.NewDesc("switchyard_batch_queue_depth",
			"Batch-class jobs (Batches API lines, service_tier flex) waiting in the pool's batch queue; 0 for every pool of a model in the capacity table whose batch queue is empty.", mp, nil),
		running: prometheus.NewDesc("switchyard_pool_batch_active_jobs",
			"Batch-class jobs the pool's agents hold (their heartbeats' batch_active), not counted in switchyard_pool_active_jobs: interactive work takes their slots back.", mp, nil),
		share: prometheus.NewDesc("switchyard_pool_batch_slot_share",
			"Share of the pool's slots batch-class jobs hold (switchyard_pool_batch_active_jobs over switchyard_pool_slots).", mp, nil),
	}
}

func (d batchDescs) describe(ch chan<- *prometheus.Desc) {
	ch <- d.queued
	ch <- d.running
	ch <- d.share
}

// collect sends the batch gauges of every pool of f, and of any batch
// queue the last reading of the jobs stream found jobs in.
func (d batchDescs) collect(ch chan<- prometheus.Metric, f *dispatch.Fleet, depth map[string]map[string]int) {
	g := prometheus.GaugeValue
	queued := make(map[[2]string]int)
	for _, name := range f.AllModels() {
		m, _ := f.Model(name)
		for _, p := range m.Pools() {
			pool := p.Pool.String()
			if p.Agents > 0 {
				queued[[2]string{name, pool}] = 0
			}
			ch <- prometheus.MustNewConstMetric(d.running, g, float64(p.Batch), name, pool)
			ch <- prometheus.MustNewConstMetric(d.share, g, BatchSlotShare(p), name, pool)
		}
	}
	for model, pools := range depth {
		for pool, n := range pools {
			queued[[2]string{model, pool}] = n
		}
	}
	for k, n := range queued {
		ch <- prometheus.MustNewConstMetric(d.queued, g, float64(n), k[0], k[1])
	}
}
