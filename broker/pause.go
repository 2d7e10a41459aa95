package broker

import (
	"context"
	"sync"
	"time"
)

// pauseTick is how often the pause watch looks at the clock: a look later
// than twice this finds a pause.
const pauseTick = 20 * time.Millisecond

// pauseWatch measures the broker's own pauses: spans in which none of its
// goroutines ran (a starved or throttled CPU, a suspended VM, a long
// garbage collection). An agent's silence and a stream's stall are judged
// on the broker's clock; while the broker itself stood still, heartbeats
// and chunks waited unread in its socket, and counting that wait as the
// agents' silence would abandon live attempts (and run their prefills
// again) exactly when the machine is busiest.
type pauseWatch struct {
	now func() time.Time

	mu     sync.Mutex
	last   time.Time // the last look at the clock
	pauses [64]pause // the latest pauses, a ring
	next   int       // where the ring writes next
}

type pause struct {
	end time.Time
	d   time.Duration
}

func newPauseWatch(now func() time.Time) *pauseWatch {
	return &pauseWatch{now: now, last: now()}
}

// run looks at the clock every pauseTick until ctx ends.
func (p *pauseWatch) run(ctx context.Context) {
	t := time.NewTicker(pauseTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.look()
		}
	}
}

// look records a pause if the clock moved on by more than two ticks since
// the last look, and returns the time it looked.
func (p *pauseWatch) look() time.Time {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if late := now.Sub(p.last) - pauseTick; late > pauseTick {
		p.pauses[p.next] = pause{end: now, d: late}
		p.next = (p.next + 1) % len(p.pauses)
	}
	if now.After(p.last) {
		p.last = now
	}
	return now
}

// since returns how long the broker stood still after t, counting a pause
// that has just ended (the watch's own goroutine may not have run yet since
// the broker woke up), and the time it looked.
func (p *pauseWatch) since(t time.Time) (time.Duration, time.Time) {
	now := p.look()
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum time.Duration
	for _, ps := range p.pauses {
		if !ps.end.After(t) {
			continue
		}
		sum += min(ps.d, ps.end.Sub(t))
	}
	return sum, now
}
