//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// inflight starts n streams and waits until every one of them is running
// at an engine; it returns their results channel.
func inflight(t *testing.T, l *ledger, base string, n, maxTokens int, tag string, engines ...*engine) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.stream(context.Background(), base, fmt.Sprintf("%s in flight %d", tag, i), maxTokens, nil)
		}()
	}
	testwait.For(t, 10*time.Second, 2*time.Millisecond, func() error {
		running := 0
		for _, e := range engines {
			running += int(e.current.Load())
		}
		if running < n {
			return fmt.Errorf("%d of %d streams at the engines", running, n)
		}
		return nil
	})
	return &wg
}

// waitServes retries a short request until one completes.
func waitServes(t *testing.T, l *ledger, base, tag string) time.Duration {
	t.Helper()
	at := time.Now()
	probe := newLedger(l.limit)
	testwait.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		o := probe.stream(context.Background(), base, tag, 4, nil)
		if o.done != 1 {
			return fmt.Errorf("not served yet: %d %s", o.status, o.errMsg)
		}
		return nil
	})
	return time.Since(at)
}

// TestNATSRestart: an external nats-server process is stopped (SIGTERM)
// under a broker and two agents with streams in flight, then started again
// on the same port, first with its store, then with an empty one. While it
// is away, new requests get 503 once --publish-wait has passed; the
// streams in flight complete or
// end with one clear error; after it is back, the broker and the agents
// have reconnected (and recreated the stream and the consumer when the
// store was empty) and requests succeed.
func TestNATSRestart(t *testing.T) {
	ns := startNATSProcess(t, t.TempDir())
	// File storage, so the first restart keeps the stream; the second
	// loses it as a memory stream (the default) always does.
	// --publish-wait 1s: a request that arrives while NATS is away waits
	// that long for it to come back (a reconnect to another node of a
	// cluster takes milliseconds), then gets 503.
	b := cmdtest.StartBroker(t, "--nats-url", ns.URL(), "--stall-timeout", "2s", "--request-timeout", "30s", "--jobs-storage", "file", "--publish-wait", "1s")
	e1 := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 20 * time.Millisecond, Slots: 8})
	e2 := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 20 * time.Millisecond, Slots: 8})
	startAgent(t, ns.URL(), "a1", e1, 8)
	startAgent(t, ns.URL(), "a2", e2, 8)
	cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")
	l := newLedger(35 * time.Second)
	rounds := 2
	if soak() {
		rounds = 6
	}
	for round := range rounds {
		fresh := round%2 == 1 // every other restart loses the store
		tag := fmt.Sprintf("round %d", round)
		if o := l.stream(context.Background(), b.HTTP, tag+" before", 8, nil); o.done != 1 {
			t.Fatalf("%s: before the stop: %+v", tag, o)
		}
		flying := inflight(t, l, b.HTTP, 6, 100, tag, e1, e2) // ~2s streams
		stopped := time.Now()
		ns.Stop(t)
		testwait.Status(t, nil, b.HTTP+"/readyz", http.StatusServiceUnavailable)
		// New requests while NATS is away: 503 after the publish wait,
		// never a hang.
		var slowest time.Duration
		for i := range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			o := l.stream(ctx, b.HTTP, fmt.Sprintf("%s while away %d", tag, i), 4, nil)
			cancel()
			if o.status != http.StatusServiceUnavailable {
				t.Fatalf("%s: request while NATS is away: status %d %s %v", tag, o.status, o.errMsg, o.transport)
			}
			slowest = max(slowest, o.end.Sub(o.start))
		}
		flying.Wait()
		outage := time.Since(stopped)
		if fresh {
			ns.dir = t.TempDir()
		}
		ns.Start(t)
		back := time.Now()
		testwait.Status(t, nil, b.HTTP+"/readyz", http.StatusOK)
		cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")
		first := waitServes(t, l, b.HTTP, tag+" after")
		// Both agents pull again: waves of more concurrent requests than
		// one agent has slots, until each agent served some. (An agent may
		// bind the consumer again a moment after the other: a wave that
		// one agent alone finished proves nothing yet.)
		wave := 0
		testwait.For(t, 15*time.Second, 10*time.Millisecond, func() error {
			var mu sync.Mutex
			var wg sync.WaitGroup
			served := map[string]int{}
			for i := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					o := l.stream(context.Background(), b.HTTP, fmt.Sprintf("%s after %d.%d", tag, wave, i), 30, nil)
					mu.Lock()
					served[o.agent]++
					mu.Unlock()
				}()
			}
			wg.Wait()
			wave++
			if served["a1"] == 0 || served["a2"] == 0 {
				return fmt.Errorf("wave %d served by %v", wave, served)
			}
			return nil
		})
		t.Logf("%s (fresh store %v): 503 within %s while away; in-flight streams settled %s after the stop; served again %s after the restart (ready %s)",
			tag, fresh, slowest.Round(time.Millisecond), outage.Round(time.Millisecond), time.Since(back).Round(time.Millisecond), first.Round(time.Millisecond))
	}
	s := l.check(t)
	t.Logf("NATS restarts: %s", s)
	for code := range s.byCode {
		if code != "unavailable" && code != "stalled" && code != "upstream_error" && code != "stream_broken" {
			t.Errorf("unexpected error code %q", code)
		}
	}
}

// connectedTo returns the indexes of the cluster servers, one per client
// connection whose name starts with name.
func connectedTo(c *natstest.Cluster, name string) []int {
	var out []int
	for i, s := range c.Servers {
		if s == nil {
			continue
		}
		cz, err := s.Connz(nil)
		if err != nil {
			continue
		}
		for _, ci := range cz.Conns {
			if strings.HasPrefix(ci.Name, name) {
				out = append(out, i)
			}
		}
	}
	return out
}

// TestClusterNodeLoss: a 3-node JetStream cluster, the jobs stream with 3
// replicas, one-slot agents busy and jobs waiting in the replicated queue.
// The node the broker is connected to is shut down, then (after it is back)
// the node most agents are connected to. Every accepted request must end;
// the queued jobs must all be served. Requests whose reply chunks were lost
// in the failover may end with one clear error: they are counted.
func TestClusterNodeLoss(t *testing.T) {
	c := natstest.RunCluster(t, "sy", 3)
	b := cmdtest.StartBroker(t, "--nats-url", c.URLs(0), "--replicas", "3", "--request-timeout", "60s", "--stall-timeout", "10s")
	const agents = 3
	engines := make([]*engine, agents)
	ids := make([]string, agents)
	for i := range agents {
		engines[i] = startEngine(t, simengine.Config{Model: model, TTFT: 300 * time.Millisecond, ITL: 10 * time.Millisecond, Slots: 1})
		ids[i] = fmt.Sprintf("c%d", i)
		startAgent(t, c.URLs(i), ids[i], engines[i], 1)
	}
	cmdtest.WaitEligible(t, b.HTTP, ids...)
	l := newLedger(65 * time.Second)
	queued := 12
	if soak() {
		queued = 40
	}
	for _, victim := range []string{"switchyard-broker", "switchyard-agent"} {
		on := connectedTo(c, victim)
		if len(on) == 0 {
			t.Fatalf("no server has a %s connection", victim)
		}
		// The node with most such connections.
		count := map[int]int{}
		node := on[0]
		for _, i := range on {
			count[i]++
			if count[i] > count[node] {
				node = i
			}
		}
		var wg sync.WaitGroup
		for i := range queued {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.stream(context.Background(), b.HTTP, fmt.Sprintf("%s failover %d", victim, i), 20, nil)
			}()
		}
		// Agents busy and jobs waiting in the replicated queue.
		testwait.For(t, 20*time.Second, 5*time.Millisecond, func() error {
			busy := 0
			for _, e := range engines {
				busy += int(e.current.Load())
			}
			f := getFleetFull(t, b.HTTP)
			if busy == 0 || len(f.Models) == 0 || f.Models[0].Queue["regular"] == 0 {
				return fmt.Errorf("%d of %d agents busy, queue %+v; so far %s", busy, agents, f.Models, l.summary())
			}
			return nil
		})
		lost := time.Now()
		c.Stop(node)
		wg.Wait()
		t.Logf("node %d (%s) lost: its %d requests settled %s later", node, victim, queued, time.Since(lost).Round(time.Millisecond))
		c.Restart(node)
		c.WaitReady(3)
		cmdtest.WaitEligible(t, b.HTTP, ids...)
	}
	// The fleet serves through the cluster again, every agent pulling:
	// waves of more requests than the agents have slots until each agent
	// served some. (An agent whose pulls failed in the failover backs off
	// for up to a second before it pulls again: a wave the others alone
	// finished proves nothing yet.)
	waitServes(t, l, b.HTTP, "after the failovers")
	served := make([]int32, agents)
	for i, e := range engines {
		served[i] = e.served.Load()
	}
	wave := 0
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		var wg sync.WaitGroup
		for i := range 2 * agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.stream(context.Background(), b.HTTP, fmt.Sprintf("after the failovers %d.%d", wave, i), 5, nil)
			}()
		}
		wg.Wait()
		wave++
		for i, e := range engines {
			if e.served.Load() == served[i] {
				return fmt.Errorf("agent %s pulls nothing after the failovers (%d waves)", ids[i], wave)
			}
		}
		return nil
	})
	s := l.check(t)
	t.Logf("cluster node loss: %s", s)
	if s.refused > 0 {
		t.Errorf("%d accepted requests refused after the failover: %v", s.refused, s.byCode)
	}
	if s.ok+s.failed != s.total {
		t.Errorf("requests unaccounted for: %s", s)
	}
}
