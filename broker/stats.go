package broker

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// recentWindow is how far back the fleet view's route split looks.
const (
	recentBuckets  = 30
	recentBucketNS = int64(time.Second)
)

// routeStats counts the requests started per route in one-second buckets,
// so the fleet view can show where the last half minute of traffic went.
type routeStats struct {
	mu      sync.Mutex
	buckets [recentBuckets]struct {
		sec     int64
		regular int64
		pd      int64
	}
}

func (r *routeStats) add(now time.Time, route dispatch.Route) {
	sec := now.UnixNano() / recentBucketNS
	r.mu.Lock()
	b := &r.buckets[sec%recentBuckets]
	if b.sec != sec {
		b.sec, b.regular, b.pd = sec, 0, 0
	}
	if route == dispatch.RoutePD {
		b.pd++
	} else {
		b.regular++
	}
	r.mu.Unlock()
}

// Recent is the route split of the requests started in a recent window.
type Recent struct {
	Window  time.Duration `json:"window"`
	Regular int64         `json:"regular"`
	PD      int64         `json:"pd"`
}

func (r *routeStats) recent(now time.Time, window time.Duration) Recent {
	n := min(int64(window/time.Second), recentBuckets)
	cur := now.UnixNano() / recentBucketNS
	out := Recent{Window: time.Duration(n) * time.Second}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.buckets {
		if b.sec > cur-n && b.sec <= cur {
			out.Regular += b.regular
			out.PD += b.pd
		}
	}
	return out
}

func (b *Broker) countRoute(model string, route dispatch.Route) {
	v, ok := b.routes.Load(model)
	if !ok {
		v, _ = b.routes.LoadOrStore(model, new(routeStats))
	}
	v.(*routeStats).add(b.now(), route)
}

// RecentRoutes returns the route split of model's requests started in the
// last window (at most 30s).
func (b *Broker) RecentRoutes(model string, window time.Duration) Recent {
	v, ok := b.routes.Load(model)
	if !ok {
		return Recent{Window: window}
	}
	return v.(*routeStats).recent(b.now(), window)
}

// QueueDepth returns the jobs waiting per model and pool, as last read from
// the jobs stream.
func (b *Broker) QueueDepth() map[string]map[string]int {
	d, _ := b.queueDepth()
	return d
}

func (b *Broker) queueDepth() (map[string]map[string]int, time.Time) {
	d := b.depth.Load()
	if d == nil {
		return nil, time.Time{}
	}
	return d.pools, d.at
}

type depthReading struct {
	pools map[string]map[string]int
	// batch holds the batch-class queues' depths, apart: interactive
	// dispatch and the autoscaling signal read pools alone.
	batch map[string]map[string]int
	at    time.Time
}

// BatchQueueDepth returns the batch-class jobs waiting per model and pool,
// as last read from the jobs stream (nil before the first reading).
func (b *Broker) BatchQueueDepth() map[string]map[string]int {
	d := b.depth.Load()
	if d == nil {
		return nil
	}
	return d.batch
}

// pollDepth reads per-subject message counts of the jobs stream. With
// work-queue retention and acks at accept time, a message in the stream is
// a job no agent has taken yet.
func (b *Broker) pollDepth(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// Stamped before asking, so a reading is never newer than the state.
	at := b.now()
	st, err := b.js.Stream(ctx, b.cfg.Stream)
	if err != nil {
		return
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(b.subj.JobsAll()))
	if err != nil {
		return
	}
	subjs := info.State.Subjects
	// Offers waiting in directed queues count too: they are jobs no
	// agent has taken yet.
	if dst := b.directed.st.Load(); dst != nil && b.directed.usable.Load() {
		if dinfo, err := (*dst).Info(ctx, jetstream.WithSubjectFilter(b.subj.DirectedAll())); err == nil && len(dinfo.State.Subjects) > 0 {
			subjs = maps.Clone(subjs)
			if subjs == nil {
				subjs = make(map[string]uint64, len(dinfo.State.Subjects))
			}
			maps.Copy(subjs, dinfo.State.Subjects)
		}
	}
	out, batch := make(map[string]map[string]int), make(map[string]map[string]int)
	for subj, n := range subjs {
		j, err := b.subj.ParseJobs(subj)
		if err != nil {
			continue
		}
		into := out
		if j.Batch {
			into = batch
		}
		if into[j.Model] == nil {
			into[j.Model] = make(map[string]int)
		}
		into[j.Model][j.Pool] += int(n) // PD pools sum their pairings
	}
	b.depth.Store(&depthReading{pools: out, batch: batch, at: at})
}

// appendAgents appends an attempt's agents to ran, prefill before decode,
// leaving out those it never heard of: the request's log line names every
// agent it ran on, in attempt order.
func appendAgents(ran []string, prefill, agent string) []string {
	for _, a := range [2]string{prefill, agent} {
		if a != "" {
			ran = append(ran, a)
		}
	}
	return ran
}
