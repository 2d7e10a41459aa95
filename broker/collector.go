package broker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// fleetCollector exposes the capacity table at scrape time, so the gauges
// are exactly what dispatch decides on, with no bookkeeping per heartbeat.
type fleetCollector struct {
	b                                *Broker
	weight, agents, slots, eff, free *prometheus.Desc
	active, eligibleActive, queue    *prometheus.Desc
	// The autoscaling signal (scaling.go).
	demand, waiting     *prometheus.Desc
	hitRate, treeBlocks *prometheus.Desc
	// The latency learned per pool (timing.go).
	ttft, itl, wait, prefillRate *prometheus.Desc
	batch                        batchDescs
}

// Collector returns a Prometheus collector of the broker's fleet: route
// weights, agents by pool and state, slots, and queue depth.
func (b *Broker) Collector() prometheus.Collector {
	mp := []string{"model", "pool"}
	return &fleetCollector{
		b:      b,
		batch:  newBatchDescs(),
		weight: prometheus.NewDesc("switchyard_route_weight", "Current dispatch weight of each route.", []string{"model", "route"}, nil),
		agents: prometheus.NewDesc("switchyard_agents", "Agents in the capacity table by pool and state (stale: heartbeats missed).", []string{"model", "pool", "state"}, nil),
		slots:  prometheus.NewDesc("switchyard_pool_slots", "Slots advertised by the pool's eligible agents.", mp, nil),
		eff:    prometheus.NewDesc("switchyard_pool_effective_slots", "Slots after slow start, as dispatch counts them.", mp, nil),
		free:   prometheus.NewDesc("switchyard_pool_free_slots", "Effective slots not in use.", mp, nil),
		active: prometheus.NewDesc("switchyard_pool_active_jobs",
			"Jobs all the pool's agents in the capacity table hold, eligible or not: a draining agent's streams and those of an agent whose PD partner left count here.", mp, nil),
		eligibleActive: prometheus.NewDesc("switchyard_pool_eligible_active_jobs",
			"Jobs the pool's eligible agents hold: what dispatch subtracts from effective slots to get free slots.", mp, nil),
		queue: prometheus.NewDesc("switchyard_queue_depth",
			"Jobs waiting in the pool's queue; 0 for every pool of a model in the capacity table whose queue is empty.", mp, nil),
		demand: prometheus.NewDesc("switchyard_pool_demand_jobs",
			"Work the pool has: jobs its agents hold (their heartbeats) plus jobs waiting in its queue (the jobs stream). The same on every broker of a fleet (take the max over brokers); 0 for every pool of a known model, agents or not. With switchyard_capacity_waiting_requests, what a pool's autoscaler reads.", mp, nil),
		waiting: prometheus.NewDesc("switchyard_capacity_waiting_requests",
			"Requests this broker holds waiting for an agent (--capacity-wait) because no agent serves their model now, counted in each pool that could serve them (regular, and prefill and decode unless PD cannot serve the request): they are in no queue, and are how a pool scaled to zero is asked to start. Per broker (sum over brokers); 0 for every pool of a known model.", mp, nil),
		hitRate: prometheus.NewDesc("switchyard_pool_prefix_cache_hit_ratio",
			"Prompt tokens found in the engines' prefix caches over those looked up, as the pool's agents report their engines' counters (since the engines started).", mp, nil),
		treeBlocks: prometheus.NewDesc("switchyard_affinity_tree_blocks", "(block, agent) entries in the pool's prefix-affinity tree.", mp, nil),
		ttft: prometheus.NewDesc("switchyard_pool_learned_ttft_seconds",
			"Time to first token the broker learned of the pool's agents from the chunks it relayed, a moving average (regular: publish to first token; prefill: publish to hand-off; decode: hand-off to first token).", mp, nil),
		itl:  prometheus.NewDesc("switchyard_pool_learned_itl_seconds", "Inter-token latency the broker learned of the pool's agents, a moving average.", mp, nil),
		wait: prometheus.NewDesc("switchyard_pool_learned_queue_wait_seconds", "Time from a job's publish to its agent's accept the broker learned of the pool, a moving average.", mp, nil),
		prefillRate: prometheus.NewDesc("switchyard_pool_learned_prefill_tokens_per_second",
			"Prefill throughput the broker learned of the pool's agents: uncached prompt tokens (estimated) over the time from accept to first token or hand-off.", mp, nil),
	}
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.weight, c.agents, c.slots, c.eff, c.free, c.active, c.eligibleActive, c.queue, c.demand, c.waiting, c.hitRate, c.treeBlocks, c.ttft, c.itl, c.wait, c.prefillRate} {
		ch <- d
	}
	c.batch.describe(ch)
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.b.Fleet()
	g := prometheus.GaugeValue
	for _, name := range f.AllModels() {
		m, _ := f.Model(name)
		reg, pd := m.Weights()
		ch <- prometheus.MustNewConstMetric(c.weight, g, reg, name, dispatch.RouteRegular.String())
		ch <- prometheus.MustNewConstMetric(c.weight, g, pd, name, dispatch.RoutePD.String())
		for _, p := range m.Pools() {
			pool := p.Pool.String()
			ch <- prometheus.MustNewConstMetric(c.slots, g, float64(p.Slots), name, pool)
			ch <- prometheus.MustNewConstMetric(c.eff, g, p.EffectiveSlots, name, pool)
			ch <- prometheus.MustNewConstMetric(c.free, g, p.Free, name, pool)
			ch <- prometheus.MustNewConstMetric(c.active, g, float64(p.Active), name, pool)
			ch <- prometheus.MustNewConstMetric(c.eligibleActive, g, float64(p.EligibleActive), name, pool)
		}
		counts := map[[2]string]int{}
		for i := range m.AgentsView() {
			a := &m.AgentsView()[i] // read in place: a scrape copies no fleet
			state := a.State.String()
			if a.Reason == dispatch.ReasonStale {
				state = "stale"
			}
			counts[[2]string{a.Pool.String(), state}]++
		}
		for k, n := range counts {
			ch <- prometheus.MustNewConstMetric(c.agents, g, float64(n), name, k[0], k[1])
		}
		for _, t := range PoolTimings(m) {
			if t.Agents == 0 {
				continue
			}
			pool := t.Pool.String()
			ch <- prometheus.MustNewConstMetric(c.ttft, g, t.TTFT.Seconds(), name, pool)
			if t.ITL > 0 {
				ch <- prometheus.MustNewConstMetric(c.itl, g, t.ITL.Seconds(), name, pool)
			}
			if t.QueueWait > 0 {
				ch <- prometheus.MustNewConstMetric(c.wait, g, t.QueueWait.Seconds(), name, pool)
			}
			if t.PrefillRate > 0 {
				ch <- prometheus.MustNewConstMetric(c.prefillRate, g, t.PrefillRate, name, pool)
			}
		}
	}
	for _, k := range c.b.affinityPools() {
		s := c.b.Affinity(k.model, k.pool)
		ch <- prometheus.MustNewConstMetric(c.treeBlocks, g, float64(s.Blocks), k.model, k.pool)
	}
	type hits struct{ q, h float64 }
	rates := map[[2]string]*hits{}
	for _, hb := range c.b.Heartbeats() {
		if hb.PrefixCacheQueries == nil {
			continue
		}
		k := [2]string{hb.GetModel(), hb.GetPool()}
		if rates[k] == nil {
			rates[k] = &hits{}
		}
		rates[k].q += hb.GetPrefixCacheQueries()
		rates[k].h += hb.GetPrefixCacheHits()
	}
	for k, r := range rates {
		if r.q > 0 {
			ch <- prometheus.MustNewConstMetric(c.hitRate, g, r.h/r.q, k[0], k[1])
		}
	}
	c.batch.collect(ch, f, c.b.BatchQueueDepth())
	known := c.b.knownPools()
	depths := queueDepths(f, known, c.b.QueueDepth())
	for k, n := range depths {
		ch <- prometheus.MustNewConstMetric(c.queue, g, float64(n), k[0], k[1])
	}
	for k, n := range poolDemand(f, depths) {
		ch <- prometheus.MustNewConstMetric(c.demand, g, float64(n), k[0], k[1])
	}
	waiting := c.b.CapacityWaiting()
	for _, k := range known {
		if _, ok := waiting[k]; !ok {
			waiting[k] = 0
		}
	}
	for k, n := range waiting {
		ch <- prometheus.MustNewConstMetric(c.waiting, g, float64(n), k[0], k[1])
	}
}

// poolDemand is the work of every pool of depths (every queue there is):
// the jobs the pool's agents in f hold plus those in its queue.
func poolDemand(f *dispatch.Fleet, depths map[[2]string]int) map[[2]string]int {
	out := make(map[[2]string]int, len(depths))
	for k, n := range depths {
		out[k] = n
	}
	for _, name := range f.AllModels() {
		m, _ := f.Model(name)
		for _, p := range m.Pools() {
			if p.Agents > 0 {
				out[[2]string{name, p.Pool.String()}] += p.Active
			}
		}
	}
	return out
}

// queueDepths is the depth of every queue there is: each pool with agents
// of each model in f and each known pool, agents or not (an empty queue
// reads 0, not absent), and any queue the last reading of the jobs stream
// found jobs in.
func queueDepths(f *dispatch.Fleet, known [][2]string, depth map[string]map[string]int) map[[2]string]int {
	out := make(map[[2]string]int)
	for _, k := range known {
		out[k] = 0
	}
	for _, name := range f.AllModels() {
		m, _ := f.Model(name)
		for _, p := range m.Pools() {
			if p.Agents > 0 {
				out[[2]string{name, p.Pool.String()}] = 0
			}
		}
	}
	for model, pools := range depth {
		for pool, n := range pools {
			out[[2]string{model, pool}] = n
		}
	}
	return out
}
