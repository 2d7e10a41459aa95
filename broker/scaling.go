package broker

import (
	"slices"
	"sync"

	"github.com/switchyard-ai/switchyard/subjects"
)

// modelPool names one pool of one model, as metric labels do.
type modelPool = [2]string

// capacityWaits counts the requests this broker holds waiting for
// capacity (Config.CapacityWait) per pool that could serve them: the
// signal that scales a pool up from zero agents, since such a request is
// in no queue.
type capacityWaits struct {
	mu sync.Mutex
	n  map[modelPool]int
}

func (w *capacityWaits) add(model string, pools []string, d int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n = make(map[modelPool]int)
	}
	for _, p := range pools {
		k := modelPool{model, p}
		w.n[k] += d
		if w.n[k] <= 0 {
			delete(w.n, k)
		}
	}
}

func (w *capacityWaits) snapshot() map[modelPool]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[modelPool]int, len(w.n))
	for k, v := range w.n {
		out[k] = v
	}
	return out
}

// waitPools are the pools that could serve c: regular, and the PD pools
// unless the request keeps off PD.
func (c *Call) waitPools() []string {
	if c.req.NoPD {
		return []string{subjects.PoolRegular}
	}
	return []string{subjects.PoolRegular, subjects.PoolPrefill, subjects.PoolDecode}
}

// CapacityWaiting returns the requests this broker holds waiting for
// capacity, per model and pool that could serve them.
func (b *Broker) CapacityWaiting() map[[2]string]int { return b.waits.snapshot() }

// knownPools returns every (model, pool) the broker knows: each pool of
// each model of Config.Models, and the pools agents were heard in within
// the time a model stays known, sorted.
func (b *Broker) knownPools() []modelPool {
	b.mu.Lock()
	out := make([]modelPool, 0, len(b.poolsHeard)+3*len(b.cfg.Models))
	for k := range b.poolsHeard {
		out = append(out, k)
	}
	b.mu.Unlock()
	for _, m := range b.cfg.Models {
		for _, p := range []string{subjects.PoolRegular, subjects.PoolPrefill, subjects.PoolDecode} {
			out = append(out, modelPool{m, p})
		}
	}
	slices.SortFunc(out, func(a, b modelPool) int {
		if a[0] != b[0] {
			if a[0] < b[0] {
				return -1
			}
			return 1
		}
		if a[1] < b[1] {
			return -1
		}
		if a[1] > b[1] {
			return 1
		}
		return 0
	})
	return slices.Compact(out)
}
