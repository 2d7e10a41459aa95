package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-ai/switchyard/internal/promtext"
	"github.com/switchyard-ai/switchyard/oaiformat/sse"
)

// rollout runs the realistic rollout of e2e/rollout_test.go with
// every party its own process and prints its per-window table: a regular
// pool at about 90% load with open-loop Poisson streaming traffic; a vLLM
// prefill/decode pair whose engines load for 10s; a decode agent whose
// engine never becomes healthy and an SGLang prefill agent with no
// partner; long prompts whose first token comes after more than the
// broker's stall timeout; clients that hang up at the end of their
// prefill; the regular pool drains and comes back, and PD drains.
func (e *env) rollout(d *doc) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## The realistic rollout\n\n")
	fmt.Fprintf(&b, "The rollout of `e2e/rollout_test.go`, every party its own process: a broker (`--slow-start 2s --stall-timeout 2s`, and `--capacity-wait 5s` where it has the flag), "+
		"sim-engines (`--ttft 30ms --prefill-per-token 1ms --itl 15ms`) each behind a worker-agent (`--engine openai`, `vllm` or `sglang`; `--slow-start 2s` where it has the flag). "+
		"Regular pool: 2 agents x 4 slots; PD pair: vLLM prefill and decode, 8 slots each, engines `--load-time 10s`; "+
		"then a vLLM decode agent on an engine with `--load-time never` and an SGLang prefill agent with no partner. "+
		"Open-loop Poisson streaming traffic (seeded; 12 output tokens) at 90%% of the regular pool's slots, the rate calibrated from the regular pool's throughput with 12 closed-loop clients on its 8 slots. "+
		"From \"long prompts, hang-ups\" to \"drain PD\": a ~3 s-prefill prompt (3,000 tokens) every 1.5 s, and every 400 ms a client that hangs up when its ~0.4 s prefill should end. "+
		"Route shares are over the requests sent in the window (`x-switchyard-route`); utilisation is the mean over `/v1/fleet` samples (every 50 ms) of active / effective slots of the pool's eligible agents; "+
		"TTFT is of the steady requests sent in the window.\n\n")
	table, summary, err := e.rolloutRun()
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "%s\n%s\n", table, summary)
	fmt.Println(table)
	fmt.Println(summary)
	d.add(b.String())
	return nil
}

type rolloutReq struct {
	kind      string
	sent, end time.Time
	ttft      time.Duration
	route     string
	err       string
	cancelled bool
}

type rolloutAgent struct {
	ID             string  `json:"id"`
	Pool           string  `json:"pool"`
	State          string  `json:"state"`
	Slots          int     `json:"slots"`
	Active         int     `json:"active"`
	EffectiveSlots float64 `json:"effective_slots"`
	Eligible       bool    `json:"eligible"`
	Reason         string  `json:"reason"`
}

type rolloutSample struct {
	at     time.Time
	agents []rolloutAgent
}

var bootstrapAddr = regexp.MustCompile(`bootstrap_addr=\S+:(\d+)`)

func (e *env) rolloutRun() (table, summary string, err error) {
	const (
		stall     = 2 * time.Second
		slowStart = 2 * time.Second
		tokens    = 12
	)
	scale := 1.0
	if e.quick {
		scale = 0.5
	}
	step := func(s float64) time.Duration { return time.Duration(s * scale * float64(time.Second)) }
	// Flags a binary may lack are passed only where it has them, so the
	// same scenario measures builds without them too.
	brokerArgs := []string{"--slow-start", slowStart.String(), "--stall-timeout", stall.String()}
	if hasFlag(e.path("broker"), "capacity-wait") {
		brokerArgs = append(brokerArgs, "--capacity-wait", "5s")
	}
	agentArgs := []string{}
	if hasFlag(e.path("worker-agent"), "slow-start") {
		agentArgs = append(agentArgs, "--slow-start", slowStart.String())
	}
	br, err := e.startBroker("broker-rollout", "", brokerArgs...)
	if err != nil {
		return "", "", err
	}
	defer br.stop(10 * time.Second)

	type eng struct{ addr, bootstrap string }
	engine := func(name string, args ...string) (eng, error) {
		p, err := e.sup.start(name, e.path("sim-engine"), append([]string{"--listen", "127.0.0.1:0", "--model", model,
			"--ttft", "30ms", "--prefill-per-token", "1ms", "--itl", "15ms", "--bootstrap-port", "0", "--kv-hold-timeout", "10m", "--log-level", "info"}, args...)...)
		if err != nil {
			return eng{}, err
		}
		m, err := p.waitFor(e.ctx, engineAddr, 20*time.Second)
		if err != nil {
			return eng{}, err
		}
		var bs string
		if m := bootstrapAddr.FindStringSubmatch(p.tail(20)); m != nil {
			bs = m[1]
		}
		return eng{addr: m[1], bootstrap: bs}, nil
	}
	agents := map[string]*proc{}
	agent := func(id string, en eng, slots int, args ...string) error {
		// Not startAgent: an agent whose engine loads says nothing until
		// it serves, and one whose engine never loads never does.
		p, err := e.sup.start("agent-"+id, e.path("worker-agent"), append([]string{"--nats-url", br.NATS, "--id", id, "--model", model,
			"--heartbeat", "100ms", "--log-level", "warn", "--engine-url", "http://" + en.addr, "--slots", strconv.Itoa(slots)}, append(agentArgs, args...)...)...)
		agents[id] = p
		return err
	}
	var problems []string
	must := func(err error) {
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	drain := func(id string) {
		if err := agents[id].stop(30 * time.Second); err != nil {
			problems = append(problems, fmt.Sprintf("drain %s: %v", id, err))
		}
	}
	engines := map[string]eng{}
	for _, n := range []string{"e1", "e2"} {
		if engines[n], err = engine("engine-"+n, "--slots", "4"); err != nil {
			return "", "", err
		}
	}
	for i, n := range []string{"e1", "e2"} {
		if err := agent(fmt.Sprintf("r%d", i+1), engines[n], 4, "--engine", "openai"); err != nil {
			return "", "", err
		}
	}
	if err := e.waitEligible(br.HTTP, "r1", "r2"); err != nil {
		return "", "", err
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true}}
	defer client.CloseIdleConnections()
	var (
		mu      sync.Mutex
		reqs    []*rolloutReq
		samples []rolloutSample
		wg      sync.WaitGroup
		seq     int
	)
	tag := func() int { mu.Lock(); defer mu.Unlock(); seq++; return seq }
	send := func(ctx context.Context, kind, prompt string, maxTokens int) *rolloutReq {
		r := &rolloutReq{kind: kind}
		mu.Lock()
		reqs = append(reqs, r)
		mu.Unlock()
		rolloutStream(ctx, client, br.HTTP, r, prompt, maxTokens)
		return r
	}

	// Calibrate the rate: the regular pool's throughput with more clients
	// than slots (counted after the first second, which fills them).
	calStart := time.Now()
	calEnd := calStart.Add(4 * time.Second)
	var calMu sync.Mutex
	calN := 0
	var calWG sync.WaitGroup
	for range 12 {
		calWG.Add(1)
		go func() {
			defer calWG.Done()
			for time.Now().Before(calEnd) && e.ctx.Err() == nil {
				r := &rolloutReq{}
				rolloutStream(e.ctx, client, br.HTTP, r, fmt.Sprintf("calibration %d", tag()), tokens)
				if r.err != "" {
					return
				}
				if r.end.Sub(calStart) > time.Second && r.end.Before(calEnd) {
					calMu.Lock()
					calN++
					calMu.Unlock()
				}
			}
		}()
	}
	calWG.Wait()
	if calN < 20 {
		return "", "", fmt.Errorf("calibration: only %d requests completed", calN)
	}
	capacity := float64(calN) / 3
	rate := 0.9 * capacity
	e.logf("rollout: the regular pool serves %.1f requests/s; Poisson rate %.1f/s", capacity, rate)

	ctx, stopLoad := context.WithCancel(e.ctx)
	defer stopLoad()
	wg.Add(2)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(13, 13^0x9e3779b97f4a7c15))
		next := time.Now()
		for {
			next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(next)):
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(context.Background(), "steady", fmt.Sprintf("rq-%d tell me about the rollout", tag()), tokens)
			}()
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if s, err := rolloutFleet(ctx, br.HTTP); err == nil {
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	type phase struct {
		name string
		at   time.Time
	}
	var phases []phase
	mark := func(name string) {
		phases = append(phases, phase{name, time.Now()})
		e.logf("rollout: %s", name)
	}
	waitFleet := func(what string, limit time.Duration, ok func([]rolloutAgent) bool) {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) && e.ctx.Err() == nil {
			if s, err := rolloutFleet(e.ctx, br.HTTP); err == nil && ok(s.agents) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		problems = append(problems, fmt.Sprintf("%s: not within %s", what, limit))
	}
	eligible := func(ids ...string) func([]rolloutAgent) bool {
		return func(as []rolloutAgent) bool {
			n := 0
			for _, a := range as {
				if slices.Contains(ids, a.ID) && a.Eligible {
					n++
				}
			}
			return n == len(ids)
		}
	}

	mark("regular 90%")
	time.Sleep(step(10))
	mark("PD pair loading")
	loaded := time.Now()
	for _, n := range []struct{ name, role string }{{"p1", "prefill"}, {"d1", "decode"}} {
		en, err := engine("engine-"+n.name, "--slots", "8", "--role", n.role, "--pd-protocol", "vllm", "--load-time", "10s")
		if err != nil {
			return "", "", err
		}
		engines[n.name] = en
		must(agent(n.name, en, 8, "--engine", "vllm", "--role", n.role))
	}
	for _, n := range []string{"p1", "d1"} {
		if err := e.waitHTTP("http://" + engines[n].addr + "/health"); err != nil {
			return "", "", fmt.Errorf("engine %s: %w", n, err)
		}
	}
	e.logf("rollout: PD engines loaded %s after they started", time.Since(loaded).Round(100*time.Millisecond))
	mark("PD ramp")
	waitFleet("PD pair eligible", 30*time.Second, eligible("p1", "d1"))
	time.Sleep(slowStart)

	mark("steady with PD")
	if engines["x1"], err = engine("engine-x1", "--slots", "8", "--role", "decode", "--pd-protocol", "vllm", "--load-time", "never"); err != nil {
		return "", "", err
	}
	must(agent("x1", engines["x1"], 8, "--engine", "vllm", "--role", "decode"))
	if engines["s1"], err = engine("engine-s1", "--slots", "8", "--role", "prefill", "--pd-protocol", "sglang"); err != nil {
		return "", "", err
	}
	must(agent("s1", engines["s1"], 8, "--engine", "sglang", "--role", "prefill", "--bootstrap-host", "127.0.0.1", "--bootstrap-port", engines["s1"].bootstrap))
	time.Sleep(step(8))
	mark("long prompts, hang-ups")
	hardCtx, stopHard := context.WithCancel(ctx)
	defer stopHard()
	long := strings.Repeat(" the", 3000)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for hardCtx.Err() == nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(context.Background(), "long", fmt.Sprintf("rq-%d long context:%s", tag(), long), 4)
			}()
			select {
			case <-hardCtx.Done():
			case <-time.After(1500 * time.Millisecond):
			}
		}
	}()
	probeCtx, stopProbes := context.WithCancel(hardCtx)
	defer stopProbes()
	// A probe's prompt is about 400 tokens: its prefill ends about 0.43 s
	// after an agent takes it, when the client hangs up; on the PD route
	// that is in the hand-off (the runner cannot see the prefill end, the
	// test does and hangs up exactly there).
	medium := strings.Repeat(" the", 400)
	go func() {
		defer wg.Done()
		for probeCtx.Err() == nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rctx, cancel := context.WithCancel(context.Background())
				t := time.AfterFunc(440*time.Millisecond, cancel)
				r := send(rctx, "handoff", fmt.Sprintf("rq-%d hang up in the hand-off:%s", tag(), medium), tokens)
				if !t.Stop() && r.err != "" {
					r.cancelled = true
				}
				cancel()
			}()
			select {
			case <-probeCtx.Done():
			case <-time.After(400 * time.Millisecond):
			}
		}
	}()
	time.Sleep(step(10))
	stopProbes()

	mark("drain regular")
	drain("r1")
	drain("r2")
	mark("PD only")
	time.Sleep(step(4))
	mark("regular back")
	must(agent("r3", engines["e1"], 4, "--engine", "openai"))
	must(agent("r4", engines["e2"], 4, "--engine", "openai"))
	waitFleet("r3 and r4 eligible", 30*time.Second, eligible("r3", "r4"))
	time.Sleep(slowStart + step(2))
	stopHard()
	mark("drain PD")
	drain("p1")
	drain("s1")
	waitFleet("decode idle", 30*time.Second, func(as []rolloutAgent) bool {
		for _, a := range as {
			if a.Pool == "decode" && a.Active > 0 {
				return false
			}
		}
		return true
	})
	drain("d1")
	drain("x1")
	mark("regular again")
	time.Sleep(step(3))
	mark("end")
	stopLoad()
	wg.Wait()
	if e.ctx.Err() != nil {
		return "", "", e.ctx.Err()
	}

	var t strings.Builder
	fmt.Fprintf(&t, "| window | duration | requests | regular | PD | util regular | util decode | TTFT p50 | TTFT p99 | failed | hung up |\n")
	fmt.Fprintf(&t, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	var firstErrs []string
	failed, cancelled := 0, 0
	for _, r := range reqs {
		if r.cancelled {
			cancelled++
		} else if r.err != "" {
			failed++
			if len(firstErrs) < 3 {
				firstErrs = append(firstErrs, r.kind+": "+r.err)
			}
		}
	}
	for i := 0; i+1 < len(phases); i++ {
		from, to := phases[i].at, phases[i+1].at
		n, reg, pd, bad, hung := 0, 0, 0, 0, 0
		var ttft []time.Duration
		for _, r := range reqs {
			if r.sent.Before(from) || !r.sent.Before(to) {
				continue
			}
			n++
			switch r.route {
			case "regular":
				reg++
			case "pd":
				pd++
			}
			switch {
			case r.cancelled:
				hung++
			case r.err != "":
				bad++
			}
			if r.kind == "steady" && r.ttft > 0 {
				ttft = append(ttft, r.ttft)
			}
		}
		util := func(pool string) string {
			sum, k := 0.0, 0
			for _, s := range samples {
				if s.at.Before(from) || !s.at.Before(to) {
					continue
				}
				var act, eff float64
				for _, a := range s.agents {
					if a.Pool == pool && a.Eligible {
						act, eff = act+float64(a.Active), eff+a.EffectiveSlots
					}
				}
				if eff > 0 {
					sum, k = sum+act/eff, k+1
				}
			}
			if k == 0 {
				return "–"
			}
			return fmt.Sprintf("%.0f%%", 100*sum/float64(k))
		}
		share := func(k int) string {
			if reg+pd == 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f", float64(k)/float64(reg+pd))
		}
		q := func(p float64) string {
			if len(ttft) == 0 {
				return "–"
			}
			slices.Sort(ttft)
			return fmt.Sprintf("%d ms", ttft[min(max(int(math.Ceil(p*float64(len(ttft))))-1, 0), len(ttft)-1)].Milliseconds())
		}
		fmt.Fprintf(&t, "| %s | %.1f s | %d | %s | %s | %s | %s | %s | %s | %d | %d |\n", phases[i].name, to.Sub(from).Seconds(), n,
			share(reg), share(pd), util("regular"), util("decode"), q(0.5), q(0.99), bad, hung)
	}

	// What the run leaves behind: KV the prefill engines still hold, the
	// broker's retries, agents above their effective slots.
	over := 0
	for _, s := range samples {
		for _, a := range s.agents {
			if (a.Eligible && float64(a.Active) > a.EffectiveSlots+1e-9) || a.Active > a.Slots {
				over++
			}
		}
	}
	var held []string
	for _, n := range []string{"p1", "s1"} {
		g, err := engineGauges(e.ctx, engines[n].addr)
		if err != nil {
			held = append(held, fmt.Sprintf("%s: %v", n, err))
			continue
		}
		held = append(held, fmt.Sprintf("%s %v", n, g["switchyard_sim_pd_kv_held_blocks"]))
	}
	retries := brokerCounter(e.ctx, br.HTTP, "switchyard_retries_total")
	var s strings.Builder
	fmt.Fprintf(&s, "Poisson rate %.1f requests/s (the regular pool served %.1f/s with every slot busy). Failed requests: **%d of %d**", rate, capacity, failed, len(reqs))
	if len(firstErrs) > 0 {
		fmt.Fprintf(&s, " (first: %s)", strings.Join(firstErrs, "; "))
	}
	fmt.Fprintf(&s, "; clients that hung up: %d. Broker retries: %s. KV blocks held at the end: %s. /v1/fleet samples with an agent above its effective slots: %d of %d.\n",
		cancelled, retries, strings.Join(held, ", "), over, len(samples))
	if len(problems) > 0 {
		fmt.Fprintf(&s, "\nProblems: %s.\n", strings.Join(problems, "; "))
	}
	return t.String(), s.String(), nil
}

// hasFlag reports whether the command bin lists --name in its usage.
func hasFlag(bin, name string) bool {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	return strings.Contains(string(out), "-"+name+" ")
}

func rolloutFleet(ctx context.Context, base string) (rolloutSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/fleet", nil)
	if err != nil {
		return rolloutSample{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rolloutSample{}, err
	}
	defer resp.Body.Close()
	var f struct {
		Agents []rolloutAgent `json:"agents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		return rolloutSample{}, err
	}
	return rolloutSample{at: time.Now(), agents: f.Agents}, nil
}

// brokerCounter sums a counter's series in the broker's /metrics, with
// the series that are not zero.
func brokerCounter(ctx context.Context, base, name string) string {
	m, err := promtext.Fetch(ctx, nil, base+"/metrics")
	if err != nil {
		return err.Error()
	}
	var by []string
	for _, s := range m.Samples(name) {
		if s.Value > 0 {
			by = append(by, fmt.Sprintf("{%s} %v", s.Labels, s.Value))
		}
	}
	if len(by) == 0 {
		return "0"
	}
	return fmt.Sprintf("%v (%s)", m.Sum(name), strings.Join(by, ", "))
}

// rolloutStream sends one streaming chat request and reads it to the end
// (or until ctx ends it), recording the time to the first content token.
func rolloutStream(ctx context.Context, c *http.Client, base string, r *rolloutReq, prompt string, maxTokens int) {
	r.sent = time.Now()
	defer func() { r.end = time.Now() }()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		r.err = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		r.err = err.Error()
		return
	}
	defer resp.Body.Close()
	r.route = resp.Header.Get("X-Switchyard-Route")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		r.err = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		return
	}
	events := sse.NewReader(resp.Body, maxSSEEvent)
	for {
		e, err := events.Next()
		if errors.Is(err, io.ErrUnexpectedEOF) && string(e.Data) == "[DONE]" {
			return // [DONE] without its empty line
		}
		if err != nil {
			if r.err == "" {
				r.err = fmt.Sprintf("stream ended without [DONE]: %v", err)
			}
			return
		}
		payload := string(e.Data)
		switch {
		case payload == "[DONE]":
			return
		case strings.HasPrefix(payload, `{"error"`):
			r.err = "error event: " + payload
		case r.ttft == 0 && strings.Contains(payload, `"content":"`) && !strings.Contains(payload, `"content":""`):
			r.ttft = time.Since(r.sent)
		}
	}
}
