package e2e

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// simAgent runs a worker-agent with the in-process simulator.
func simAgent(t *testing.T, natsURL, id, role string, slots int) *cmdtest.Proc {
	t.Helper()
	return startAgentCmd(t, natsURL, "--nats-url", natsURL, "--engine", "sim", "--role", role, "--pd-protocol", "vllm",
		"--id", id, "--slots", fmt.Sprint(slots), "--heartbeat", liveHeartbeat, "--sim-ttft", "2ms", "--sim-itl", "4ms", "--log-level", "warn", "--slow-start", "0")
}

type started struct {
	at    time.Time
	route string
	err   string
}

type shareSample struct {
	at      time.Time
	pdShare float64
	agents  map[string]agentSample
}

// agentSample is one agent in the dispatcher's view.
type agentSample struct {
	effectiveSlots float64
	readySince     time.Time
}

// TestTransition is the rollout scenario: 4 regular agents under continuous
// streaming load; add 1 prefill + 1 decode, then 2 more of each; drain the
// regular agents one by one; then the reverse. No request may fail, no agent
// may hold more than its slots, the PD share of started requests per window
// must follow the dispatcher's published share, and a newly joined agent's
// effective slots must follow its slow-start ramp instead of starting full.
func TestTransition(t *testing.T) {
	if testing.Short() {
		t.Skip("transition scenario takes ~25s")
	}
	const slots = 4
	const ramp = 2 * time.Second
	b := cmdtest.StartBroker(t, "--slow-start", ramp.String())
	agents := map[string]*cmdtest.Proc{}
	add := func(id, role string) { agents[id] = simAgent(t, b.NATS, id, role, slots) }
	drain := func(id string) {
		if err := agents[id].Stop(t); err != nil {
			t.Errorf("agent %s: %v", id, err)
		}
	}
	for i := 1; i <= 4; i++ {
		add(fmt.Sprintf("r%d", i), "regular")
	}
	cmdtest.WaitEligible(t, b.HTTP, "r1", "r2", "r3", "r4")
	// The first agents finish their own ramp before load: wait until the
	// broker counts each at its full slots.
	testwait.For(t, 30*time.Second, 20*time.Millisecond, func() error {
		for _, a := range getFleetFull(t, b.HTTP).Agents {
			if a.EffectiveSlots < slots {
				return fmt.Errorf("agent %s at %.2f of %d slots", a.ID, a.EffectiveSlots, slots)
			}
		}
		return nil
	})

	// Load: closed-loop streaming clients.
	ctx, stopLoad := context.WithCancel(context.Background())
	var mu sync.Mutex
	var reqs []started
	var wg sync.WaitGroup
	for c := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				at := time.Now()
				r, err := rawStream(context.Background(), b.HTTP, fmt.Sprintf("client %d request %d", c, i), 12)
				s := started{at: at, route: r.route}
				switch {
				case err != nil:
					s.err = err.Error()
				case r.status != 200 || !r.done || r.errMsg != "":
					s.err = fmt.Sprintf("status %d done %v: %s", r.status, r.done, r.errMsg)
				}
				mu.Lock()
				reqs = append(reqs, s)
				mu.Unlock()
			}
		}()
	}
	// Sample the dispatcher's view every 50ms.
	var samples []shareSample
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		for ctx.Err() == nil {
			f := getFleetFull(t, b.HTTP)
			s := shareSample{at: time.Now(), agents: map[string]agentSample{}}
			if len(f.Models) > 0 {
				s.pdShare = f.Models[0].Share["pd"]
			}
			for _, a := range f.Agents {
				s.agents[a.ID] = agentSample{a.EffectiveSlots, a.ReadySince}
			}
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	peaks := watchHeartbeats(t, b.NATS)

	type phase struct {
		name string
		at   time.Time
	}
	var phases []phase
	mark := func(name string) { phases = append(phases, phase{name, time.Now()}) }
	mark("regular only")
	time.Sleep(2 * time.Second)
	mark("+1P +1D")
	add("p1", "prefill")
	add("d1", "decode")
	time.Sleep(3 * time.Second)
	mark("+2P +2D")
	add("p2", "prefill")
	add("p3", "prefill")
	add("d2", "decode")
	add("d3", "decode")
	time.Sleep(3 * time.Second)
	for i := 1; i <= 4; i++ {
		mark(fmt.Sprintf("drain r%d", i))
		drain(fmt.Sprintf("r%d", i))
		time.Sleep(time.Second)
	}
	mark("PD only")
	time.Sleep(2 * time.Second)
	mark("regular back")
	for i := 5; i <= 8; i++ {
		add(fmt.Sprintf("r%d", i), "regular")
	}
	time.Sleep(3 * time.Second)
	mark("drain prefill")
	for _, id := range []string{"p1", "p2", "p3"} {
		drain(id)
	}
	// Decode jobs already handed off still need a decode agent: wait for
	// the PD pipeline to empty before draining decode, as the runbook says.
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		f := getFleetFull(t, b.HTTP)
		for _, a := range f.Agents {
			if a.Pool == "decode" && a.Active > 0 {
				return fmt.Errorf("decode %s busy", a.ID)
			}
		}
		if len(f.Models) > 0 && f.Models[0].Queue["decode"] > 0 {
			return fmt.Errorf("decode queue %d", f.Models[0].Queue["decode"])
		}
		return nil
	})
	mark("drain decode")
	for _, id := range []string{"d1", "d2", "d3"} {
		drain(id)
	}
	time.Sleep(time.Second)
	mark("end")
	stopLoad()
	wg.Wait()
	<-sampleDone

	// No failures.
	failed := 0
	for _, r := range reqs {
		if r.err != "" {
			failed++
			if failed < 5 {
				t.Errorf("failed request at %s: %s", r.at.Format("15:04:05.000"), r.err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests failed", failed, len(reqs))
	}
	// No agent above its slots.
	peaks.mu.Lock()
	for id, p := range peaks.peak {
		if p > peaks.slots[id] {
			t.Errorf("agent %s held %d jobs, slots %d", id, p, peaks.slots[id])
		}
	}
	peaks.mu.Unlock()

	// Per-phase shares: observed PD fraction of started requests versus the
	// dispatcher's published share when each started (the latest sample
	// before it). A route is a draw, so the bound allows for the draws'
	// spread, four standard deviations: a busy machine starts fewer
	// requests in a phase, and 51 at a share of 0.65 came out at 0.47.
	var table strings.Builder
	fmt.Fprintf(&table, "| phase | requests | PD observed | PD weight share |\n|---|---|---|---|\n")
	shareAt := func(at time.Time) float64 {
		i, _ := slices.BinarySearchFunc(samples, at, func(s shareSample, at time.Time) int { return s.at.Compare(at) })
		return samples[max(i-1, 0)].pdShare
	}
	for i := 0; i+1 < len(phases); i++ {
		from, to := phases[i].at, phases[i+1].at
		n, pd := 0, 0
		sum, variance := 0.0, 0.0
		for _, r := range reqs {
			if !r.at.Before(from) && r.at.Before(to) {
				n++
				if r.route == "pd" {
					pd++
				}
				p := shareAt(r.at)
				sum += p
				variance += p * (1 - p)
			}
		}
		if n == 0 || len(samples) == 0 {
			continue
		}
		obs, exp := float64(pd)/float64(n), sum/float64(n)
		fmt.Fprintf(&table, "| %s | %d | %.2f | %.2f |\n", phases[i].name, n, obs, exp)
		if bound := max(0.15, 4*math.Sqrt(variance)/float64(n)); n >= 40 && math.Abs(obs-exp) > bound {
			t.Errorf("phase %q: PD got %.2f of %d requests, dispatcher share %.2f (bound %.2f)", phases[i].name, obs, n, exp, bound)
		}
		switch phases[i].name {
		case "regular only":
			if pd != 0 {
				t.Errorf("PD requests with no PD agents: %d", pd)
			}
		case "PD only":
			if pd != n {
				t.Errorf("regular requests with no regular agents: %d", n-pd)
			}
		}
	}
	t.Logf("route shares per phase:\n%s", table.String())

	// Slow start: the first PD pair's effective slots start near the floor
	// instead of at full slots, and reach full slots once ramped. A ramp
	// starts when its agent says ready, which a busy machine puts well
	// after the test started it: the windows are the agents' own. (That
	// requests follow the published share, ramp and all, is checked per
	// phase above. The share itself, from free slots, moves with the load
	// from one sample to the next, and one agent's active count, from
	// 500ms heartbeats, was seen at 0 both early and late: neither shows
	// the ramp reliably.)
	seen := 0
	for _, id := range []string{"p1", "d1"} {
		ready := readySince(samples, id)
		if ready.IsZero() {
			t.Errorf("%s never sampled as ready", id)
			continue
		}
		early, full := 0, 0
		for _, s := range samples {
			a, ok := s.agents[id]
			switch {
			case !ok || a.effectiveSlots == 0:
			case s.at.Before(ready.Add(ramp / 5)):
				early++
				if a.effectiveSlots > 0.5*slots {
					t.Errorf("%s effective slots %.2f at %s after ready: no slow start", id, a.effectiveSlots, s.at.Sub(ready))
				}
			case !s.at.Before(ready.Add(ramp)) && s.at.Before(ready.Add(ramp+time.Second)) && a.effectiveSlots >= slots:
				full++
			}
		}
		t.Logf("%s: %d samples in the first %s of its ramp, %d at full slots in the second after it", id, early, ramp/5, full)
		seen += early
		if full == 0 {
			t.Errorf("%s never at its full %d slots in the second after its ramp", id, slots)
		}
	}
	if seen == 0 {
		t.Error("no sample of the new agents during their ramp")
	}
}

// readySince is when the dispatcher's view first has agent id ready.
func readySince(samples []shareSample, id string) time.Time {
	for _, s := range samples {
		if a, ok := s.agents[id]; ok && !a.readySince.IsZero() {
			return a.readySince
		}
	}
	return time.Time{}
}
