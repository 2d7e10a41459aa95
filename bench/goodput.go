package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-ai/switchyard/oaiformat/sse"
)

// The goodput scenario's service targets: a request is good when its
// time to first token and its time per output token after the first are
// within them; a rate is sustained when goodFraction of its requests are.
const (
	goodTTFT     = 2 * time.Second
	goodTPOT     = 20 * time.Millisecond
	goodFraction = 0.9
)

// goodputFleet is one step of a rollout from regular to PD.
type goodputFleet struct{ regular, prefill, decode int }

// oneRoute reports whether f has only one route, regular or PD, so that
// every dispatch mode sends everything there.
func (f goodputFleet) oneRoute() bool { return f.regular == 0 || f.prefill == 0 }

func (f goodputFleet) String() string {
	if f.prefill == 0 && f.decode == 0 {
		return fmt.Sprintf("%d regular", f.regular)
	}
	return fmt.Sprintf("%d+%dP+%dD", f.regular, f.prefill, f.decode)
}

// goodputResult is one fleet and mode's sweep: its goodput and every
// rate it measured, in the order measured.
type goodputResult struct {
	goodput float64
	points  []goodputPoint
}

// goodputPoint is one rate's window: how many requests were sent, met
// both targets, and failed outright (an error status or error event, or
// no answer), and how busy the machine's CPUs were meanwhile.
type goodputPoint struct {
	rate             float64
	sent, good, fail int
	busy             float64
}

func (p goodputPoint) attainment() float64 {
	if p.sent == 0 {
		return 0
	}
	return float64(p.good) / float64(p.sent)
}

// goodput measures, per rollout step and dispatch mode, the highest
// Poisson arrival rate at which at least 90% of requests meet TTFT <= 2s
// and TPOT <= 20ms, on fleets of batch-model sim-engines (each behind its
// own worker-agent) under a mixed workload: 70% chat, 30% long documents.
func (e *env) goodput(d *doc) error {
	fleets := []goodputFleet{{8, 0, 0}, {6, 1, 1}, {4, 2, 2}, {2, 3, 3}, {0, 4, 4}}
	modes := []string{"count", "capacity", "threshold", "slo"}
	sw := goodputSweep{start: 16, window: 25 * time.Second, steps: 3}
	if e.quick {
		sw = goodputSweep{start: 4, window: 6 * time.Second, steps: 2}
	}
	results := map[string]goodputResult{}
	for _, f := range fleets {
		for _, mode := range modes {
			if f.oneRoute() && mode != modes[0] {
				continue // every mode is the same
			}
			e.logf("goodput: %s, mode %s", f, mode)
			r, err := e.goodputRun(f, mode, sw, 1)
			e.sup.stopAll()
			if err != nil {
				return fmt.Errorf("%s %s: %w", f, mode, err)
			}
			results[f.String()+"/"+mode] = r
			e.logf("goodput: %s, mode %s: %g %s", f, mode, r.goodput, r.describe())
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Goodput by dispatch mode through a rollout to PD\n\n")
	fmt.Fprintf(&b, "Fleets of `sim-engine --batch-model` processes (the batch model's defaults, 16 slots), each behind its own worker-agent (16 slots), "+
		"prefill and decode over the vLLM hand-off. Workload: 70%% chat (20-300 words in, 50-250 tokens out), 30%% long documents (4,000-12,000 words in, 100-200 tokens out), "+
		"Poisson arrivals for %s per rate. Goodput is the highest rate (requests/s) at which at least %.0f%% of requests met TTFT <= %s and TPOT <= %s "+
		"(the broker runs with `--slo-ttft %s --slo-itl %s`, the targets `slo` predicts for). "+
		"Each sweep doubles the rate from %g until a rate misses, then halves the gap %d times. "+
		"Failed requests count as misses. A fleet with one route (all regular, all PD) runs once: every mode sends everything there.\n\n",
		sw.window, goodFraction*100, goodTTFT, goodTPOT, goodTTFT, goodTPOT, sw.start, sw.bisect())
	fmt.Fprintf(&b, "| fleet | %s |\n|---|%s\n", strings.Join(modes, " | "), strings.Repeat("---:|", len(modes)))
	for _, f := range fleets {
		row := []string{f.String()}
		for _, mode := range modes {
			r, ok := results[f.String()+"/"+mode]
			if !ok {
				r, ok = results[f.String()+"/"+modes[0]]
			}
			if !ok {
				row = append(row, "")
				continue
			}
			row = append(row, fmt.Sprintf("%g", r.goodput))
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintf(&b, "\nEvery rate measured, as rate: attainment (failed requests; the machine's CPU use):\n\n| fleet | mode | goodput | rates |\n|---|---|---:|---|\n")
	for _, f := range fleets {
		for _, mode := range modes {
			if r, ok := results[f.String()+"/"+mode]; ok {
				fmt.Fprintf(&b, "| %s | %s | %g | %s |\n", f, mode, r.goodput, r.describe())
			}
		}
	}
	// Run-to-run noise: the middle step again, with other arrivals.
	mid := fleets[len(fleets)/2]
	var again []string
	for _, mode := range []string{"count", "capacity", "slo"} {
		first, ok := results[mid.String()+"/"+mode]
		if !ok || mid.oneRoute() {
			continue
		}
		e.logf("goodput: %s, mode %s, again", mid, mode)
		r, err := e.goodputRun(mid, mode, sw, 2)
		e.sup.stopAll()
		if err != nil {
			return fmt.Errorf("%s %s again: %w", mid, mode, err)
		}
		again = append(again, fmt.Sprintf("%s %g then %g (%s)", mode, first.goodput, r.goodput, r.describe()))
	}
	if len(again) > 0 {
		fmt.Fprintf(&b, "\nRun-to-run noise, %s measured twice with other arrivals: %s.\n", mid, strings.Join(again, "; "))
	}
	if err := goodputPlots(d.out, fleets, modes, results); err != nil {
		return err
	}
	fmt.Fprintf(&b, "\n![goodput along the rollout](img/bench-goodput-rollout.svg)\n\n![attainment against rate, 4+2P+2D](img/bench-goodput-attainment.svg)\n")

	// The realistic rollout, at 70% of the lowest goodput slo had along it.
	low := math.Inf(1)
	for _, f := range fleets {
		mode := "slo"
		if f.oneRoute() {
			mode = modes[0]
		}
		if r, ok := results[f.String()+"/"+mode]; ok {
			low = min(low, r.goodput)
		}
	}
	if !math.IsInf(low, 1) && low > 0 && slices.Contains(modes, "slo") {
		rate, dwell := 0.7*low, 20*time.Second
		if e.quick {
			dwell = 5 * time.Second
		}
		e.logf("goodput: the rollout under slo at %.1f requests/s", rate)
		table, worst, err := e.goodputRollout(rate, dwell)
		e.sup.stopAll()
		if err != nil {
			return fmt.Errorf("rollout: %w", err)
		}
		fmt.Fprintf(&b, "\n### The rollout under slo at 70%% of its goodput\n\n"+
			"From 8 regular engines to 4 prefill + 4 decode under `slo`, at %.1f requests/s (70%% of %g, the lowest goodput `slo` had along the rollout), "+
			"the broker and agents at their default slow start. Each step starts a prefill and a decode engine that load for 15 s, "+
			"and once both are eligible drains two regular agents (SIGTERM) and stops their engines; %s between steps. "+
			"Requests are counted in the 10 s window they were sent in. Lowest attainment in a full window: **%.1f%%**.\n\n%s",
			rate, low, dwell, worst*100, table)
	}
	fmt.Println(b.String())
	d.add(b.String())
	return nil
}

// goodputPlots draws goodput along the rollout per mode, and attainment
// against rate per mode at the middle step.
func goodputPlots(out string, fleets []goodputFleet, modes []string, results map[string]goodputResult) error {
	var labels []string
	var along []curve
	for _, mode := range modes {
		c := curve{name: mode}
		for i, f := range fleets {
			r, ok := results[f.String()+"/"+mode]
			if !ok {
				r, ok = results[f.String()+"/"+modes[0]]
			}
			if ok {
				c.x, c.y = append(c.x, float64(i)), append(c.y, r.goodput)
			}
		}
		along = append(along, c)
	}
	for _, f := range fleets {
		labels = append(labels, f.String())
	}
	if err := (lineChart{title: "Goodput along the rollout, by dispatch mode", xLabel: "fleet (regular + prefill + decode engines)",
		yLabel: "goodput (requests/s)", labels: labels}).write(filepath.Join(out, "img/bench-goodput-rollout.svg"), along); err != nil {
		return err
	}
	mid := fleets[len(fleets)/2].String()
	var att []curve
	for _, mode := range modes {
		r, ok := results[mid+"/"+mode]
		if !ok {
			continue
		}
		pts := slices.Clone(r.points)
		slices.SortFunc(pts, func(a, b goodputPoint) int { return cmp.Compare(a.rate, b.rate) })
		c := curve{name: mode}
		for _, p := range pts {
			c.x, c.y = append(c.x, p.rate), append(c.y, p.attainment()*100)
		}
		att = append(att, c)
	}
	return (lineChart{title: "Requests meeting both targets against rate, " + mid, xLabel: "rate (requests/s)",
		yLabel: "met TTFT and TPOT targets (%)", yMax: 100, guide: goodFraction * 100}).write(filepath.Join(out, "img/bench-goodput-attainment.svg"), att)
}

// goodputSweep is how rates are tried: from start, doubling until one
// misses, then halving the gap between the best sustained and the
// lowest missed rate steps times, each rate for window.
type goodputSweep struct {
	start  float64
	window time.Duration
	steps  int
}

func (s goodputSweep) bisect() int {
	if s.steps == 0 {
		return 3
	}
	return s.steps
}

func (r goodputResult) describe() string {
	pts := slices.Clone(r.points)
	slices.SortFunc(pts, func(a, b goodputPoint) int { return cmp.Compare(a.rate, b.rate) })
	var parts []string
	for _, p := range pts {
		parts = append(parts, fmt.Sprintf("%g: %.1f%% (%d; %.0f%%)", p.rate, p.attainment()*100, p.fail, p.busy*100))
	}
	return strings.Join(parts, ", ")
}

// goodputProcs is a running fleet of the scenario: its broker and each
// agent's engine and worker-agent processes.
type goodputProcs struct {
	e               *env
	br              *brokerProc
	agents, engines map[string]*proc
}

const goodputSlots = 16

// goodputBroker starts a broker dispatching by mode with the scenario's
// targets, with brokerArgs after them.
func (e *env) goodputBroker(mode string, brokerArgs ...string) (*goodputProcs, error) {
	br, err := e.startBroker("broker-goodput-"+mode, "", append([]string{"--dispatch-mode", mode,
		"--slo-ttft", goodTTFT.String(), "--slo-itl", goodTPOT.String()}, brokerArgs...)...)
	if err != nil {
		return nil, err
	}
	return &goodputProcs{e: e, br: br, agents: map[string]*proc{}, engines: map[string]*proc{}}, nil
}

// add starts a batch-model engine in role (regular, prefill or decode)
// with engineArgs, and its agent with agentArgs; it does not wait for the
// engine to load.
func (g *goodputProcs) add(id, role string, engineArgs, agentArgs []string) error {
	e := g.e
	p, err := e.sup.start("goodput-engine-"+id, e.path("sim-engine"), append([]string{"--listen", "127.0.0.1:0", "--model", model, "--batch-model",
		"--slots", strconv.Itoa(goodputSlots), "--role", role, "--pd-protocol", "vllm", "--bootstrap-port", "0", "--log-level", "info"}, engineArgs...)...)
	if err != nil {
		return err
	}
	g.engines[id] = p
	m, err := p.waitFor(e.ctx, engineAddr, 20*time.Second)
	if err != nil {
		return err
	}
	args := append([]string{"--engine-url", "http://" + m[1], "--slots", strconv.Itoa(goodputSlots)}, agentArgs...)
	switch role {
	case "regular":
		args = append(args, "--engine", "openai")
	case "prefill":
		bs := bootstrapAddr.FindStringSubmatch(p.tail(20))
		if bs == nil {
			return fmt.Errorf("engine %s: no bootstrap address in its log", id)
		}
		args = append(args, "--engine", "vllm", "--role", "prefill", "--bootstrap-host", "127.0.0.1", "--bootstrap-port", bs[1])
	case "decode":
		args = append(args, "--engine", "vllm", "--role", "decode")
	}
	a, err := e.startAgent(id, g.br.NATS, "", args...)
	if err != nil {
		return err
	}
	g.agents[id] = a
	return nil
}

// remove drains id's agent (SIGTERM: it finishes what it runs) and then
// stops its engine.
func (g *goodputProcs) remove(id string) error {
	err := g.agents[id].stop(2 * time.Minute)
	if err2 := g.engines[id].stop(5 * time.Second); err == nil {
		err = err2
	}
	delete(g.agents, id)
	delete(g.engines, id)
	return err
}

// warm sends a few requests, long and short, at once: the broker learns
// every route's latency from them.
func (g *goodputProcs) warm(client *http.Client, rng *rand.Rand) {
	var wg sync.WaitGroup
	for i := range 16 {
		w := goodputWork(rng, -1-i, i%3 == 0)
		wg.Go(func() { _, _ = goodputRequest(g.e.ctx, client, g.br.HTTP, w) })
	}
	wg.Wait()
}

func goodputClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true}}
}

// goodputRun starts fleet f under mode and sweeps the rate.
func (e *env) goodputRun(f goodputFleet, mode string, sw goodputSweep, seed uint64) (goodputResult, error) {
	g, err := e.goodputBroker(mode, "--slow-start", "0")
	if err != nil {
		return goodputResult{}, err
	}
	var ids []string
	for _, n := range []struct {
		role   string
		prefix string
		count  int
	}{{"regular", "r", f.regular}, {"prefill", "p", f.prefill}, {"decode", "d", f.decode}} {
		for i := range n.count {
			id := fmt.Sprintf("%s%d", n.prefix, i+1)
			if err := g.add(id, n.role, nil, []string{"--slow-start", "0"}); err != nil {
				return goodputResult{}, err
			}
			ids = append(ids, id)
		}
	}
	if err := e.waitEligible(g.br.HTTP, ids...); err != nil {
		return goodputResult{}, err
	}
	client := goodputClient()
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(uint64(len(ids)), seed))
	g.warm(client, rng)

	var res goodputResult
	st := sw.begin()
	for rate, more := sw.start, true; more; {
		if e.ctx.Err() != nil {
			return res, e.ctx.Err()
		}
		p := e.goodputRate(client, g.br.HTTP, rng, rate, sw.window)
		res.points = append(res.points, p)
		if p.attainment() >= goodFraction {
			res.goodput = max(res.goodput, rate)
		}
		rate, more = st.next(rate, p.attainment() >= goodFraction)
	}
	return res, nil
}

// sweepState is where a sweep stands: the best rate sustained, the
// lowest missed (+Inf before one is) and how often the gap was halved.
type sweepState struct {
	sw       goodputSweep
	lo, hi   float64
	halvings int
}

func (sw goodputSweep) begin() *sweepState { return &sweepState{sw: sw, hi: math.Inf(1)} }

// next takes whether rate was sustained and returns the rate to try
// next, or false when the sweep is done: rates double until one misses,
// then the gap is halved (to half a request per second) sw.bisect() times.
func (st *sweepState) next(rate float64, sustained bool) (float64, bool) {
	if sustained {
		st.lo = max(st.lo, rate)
	} else {
		st.hi = min(st.hi, rate)
	}
	if math.IsInf(st.hi, 1) {
		return rate * 2, true
	}
	if st.halvings == st.sw.bisect() {
		return 0, false
	}
	st.halvings++
	r := math.Round((st.lo+st.hi)/2*2) / 2
	return r, r != st.lo && r != st.hi
}

// goodputOutcome is one request of the rollout: when it was sent, and
// whether it met the targets or failed.
type goodputOutcome struct {
	sent        time.Time
	met, failed bool
}

// goodputRollout runs the realistic rollout from 8 regular engines to 4
// prefill + 4 decode under dispatch mode slo, at a steady Poisson rate:
// each step starts a prefill and a decode engine that load for 15 s
// (their agents warming meanwhile, then in slow start), and once both
// are eligible drains two regular agents (SIGTERM: they finish what
// they run) and stops their engines; 20 s between steps. It returns the
// per-10 s-window table and the lowest window's attainment.
func (e *env) goodputRollout(rate float64, dwell time.Duration) (string, float64, error) {
	const window, load = 10 * time.Second, "15s"
	g, err := e.goodputBroker("slo")
	if err != nil {
		return "", 0, err
	}
	var regular []string
	for i := range 8 {
		id := fmt.Sprintf("r%d", i+1)
		if err := g.add(id, "regular", nil, nil); err != nil {
			return "", 0, err
		}
		regular = append(regular, id)
	}
	if err := e.waitEligible(g.br.HTTP, regular...); err != nil {
		return "", 0, err
	}
	client := goodputClient()
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(8, 3))
	g.warm(client, rng)

	var (
		mu       sync.Mutex
		outcomes []goodputOutcome
		wg       sync.WaitGroup
	)
	ctx, stop := context.WithCancel(e.ctx)
	start := time.Now()
	sender := make(chan struct{})
	go func() {
		defer close(sender)
		for i := 0; ctx.Err() == nil; i++ {
			w := goodputWork(rng, i, rng.Float64() < 0.3)
			sent := time.Now()
			wg.Go(func() {
				met, failed := goodputRequest(e.ctx, client, g.br.HTTP, w)
				mu.Lock()
				outcomes = append(outcomes, goodputOutcome{sent: sent, met: met, failed: failed})
				mu.Unlock()
			})
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))):
			}
		}
	}()
	type mark struct {
		at    time.Duration
		fleet string
	}
	marks := []mark{{0, goodputFleet{8, 0, 0}.String()}}
	sleep := func(d time.Duration) {
		select {
		case <-e.ctx.Done():
		case <-time.After(d):
		}
	}
	var problems []string
	sleep(dwell)
	for step := 1; step <= 4 && e.ctx.Err() == nil; step++ {
		p, d := fmt.Sprintf("p%d", step), fmt.Sprintf("d%d", step)
		for _, n := range []struct{ id, role string }{{p, "prefill"}, {d, "decode"}} {
			if err := g.add(n.id, n.role, []string{"--load-time", load}, nil); err != nil {
				stop()
				return "", 0, err
			}
		}
		if err := e.waitEligible(g.br.HTTP, p, d); err != nil {
			problems = append(problems, err.Error())
		}
		var drains sync.WaitGroup
		for _, id := range regular[:2] {
			drains.Go(func() {
				if err := g.remove(id); err != nil {
					mu.Lock()
					problems = append(problems, fmt.Sprintf("drain %s: %v", id, err))
					mu.Unlock()
				}
			})
		}
		drains.Wait()
		regular = regular[2:]
		marks = append(marks, mark{time.Since(start), goodputFleet{8 - 2*step, step, step}.String()})
		sleep(dwell)
	}
	stop()
	<-sender
	wg.Wait()

	var b strings.Builder
	fmt.Fprintf(&b, "| window (s) | fleet at its end | sent | met targets | failed |\n|---|---|---:|---:|---:|\n")
	worst := 1.0
	for w0 := time.Duration(0); w0 < time.Since(start); w0 += window {
		var sent, met, failed int
		for _, o := range outcomes {
			if at := o.sent.Sub(start); at >= w0 && at < w0+window {
				sent++
				if o.met {
					met++
				}
				if o.failed {
					failed++
				}
			}
		}
		if sent == 0 {
			continue
		}
		fleet := marks[0].fleet
		for _, m := range marks {
			if m.at < w0+window {
				fleet = m.fleet
			}
		}
		frac := float64(met) / float64(sent)
		if sent >= int(rate*window.Seconds()/2) { // a last, partial window does not count
			worst = min(worst, frac)
		}
		fmt.Fprintf(&b, "| %.0f-%.0f | %s | %d | %.1f%% | %d |\n", w0.Seconds(), (w0 + window).Seconds(), fleet, sent, frac*100, failed)
	}
	if len(problems) > 0 {
		fmt.Fprintf(&b, "\nProblems: %s\n", strings.Join(problems, "; "))
	}
	return b.String(), worst, nil
}

// goodputWork is one request of the mix: a chat turn, or (long) a long
// document to summarize. Prompts are distinct from their first word.
type goodputReq struct {
	prompt    string
	maxTokens int
}

func goodputWork(rng *rand.Rand, i int, long bool) goodputReq {
	words, out := 20+rng.IntN(281), 50+rng.IntN(201)
	if long {
		words, out = 4000+rng.IntN(8001), 100+rng.IntN(101)
	}
	vocab := []string{"the", "report", "describes", "a", "river", "system", "with", "seasonal", "floods", "and", "dry", "summers"}
	var sb strings.Builder
	fmt.Fprintf(&sb, "request%d", i)
	for w := 1; w < words; w++ {
		sb.WriteByte(' ')
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return goodputReq{prompt: sb.String(), maxTokens: out}
}

// goodputRate sends Poisson arrivals at rate for window and waits for
// every answer.
func (e *env) goodputRate(client *http.Client, base string, rng *rand.Rand, rate float64, window time.Duration) goodputPoint {
	p := goodputPoint{rate: rate}
	var mu sync.Mutex
	var wg sync.WaitGroup
	busy0, all0 := machineCPU()
	end := time.Now().Add(window)
	for i := 0; time.Now().Before(end) && e.ctx.Err() == nil; i++ {
		w := goodputWork(rng, i, rng.Float64() < 0.3)
		p.sent++
		wg.Go(func() {
			met, failed := goodputRequest(e.ctx, client, base, w)
			mu.Lock()
			if met {
				p.good++
			}
			if failed {
				p.fail++
			}
			mu.Unlock()
		})
		select {
		case <-e.ctx.Done():
		case <-time.After(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))):
		}
	}
	busy1, all1 := machineCPU()
	if all1 > all0 {
		p.busy = float64(busy1-busy0) / float64(all1-all0)
	}
	wg.Wait()
	return p
}

// machineCPU reads the machine's busy and total CPU time from
// /proc/stat, in clock ticks; zeros where there is none.
func machineCPU() (busy, all int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all
}

// goodputRequest streams one request and reports whether it met the
// targets, TTFT <= goodTTFT and mean time per output token after the
// first <= goodTPOT, and whether it failed: an error status or event, or
// no complete answer.
func goodputRequest(ctx context.Context, c *http.Client, base string, w goodputReq) (met, failed bool) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, w.prompt, w.maxTokens)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return false, true
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return false, true
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return false, true
	}
	var first, last time.Time
	tokens := 0
	events := sse.NewReader(resp.Body, maxSSEEvent)
	for {
		e, err := events.Next()
		if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && string(e.Data) == "[DONE]") {
			break
		}
		payload := string(e.Data)
		switch {
		case payload == "[DONE]":
			if tokens == 0 {
				return false, true
			}
			if first.Sub(sent) > goodTTFT {
				return false, false
			}
			return tokens < 2 || last.Sub(first)/time.Duration(tokens-1) <= goodTPOT, false
		case strings.HasPrefix(payload, `{"error"`):
			return false, true
		case strings.Contains(payload, `"content":"`) && !strings.Contains(payload, `"content":""`):
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			last = now
			tokens++
		}
	}
	return false, true
}
