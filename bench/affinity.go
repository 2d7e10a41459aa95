package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/oaiformat/sse"
)

// The affinity scenario: multi-turn chat on sim-engines with a
// bounded prefix cache, each turn re-sending the whole conversation. It
// compares Switchyard's prefix-cache affinity (approximate and precise)
// with pure pull and with nginx round robin and consistent hashing on a
// conversation header.

// affinityWorkload sizes the scenario.
type affinityWorkload struct {
	convs, turns, groups int
	systemWords          int
	userWords            int
	outTokens            int
	load                 float64
	// hot conversations (the first hot of convs) have hotTurns turns and
	// are hotWeight times as likely as the others to take the next
	// arrival while idle: agent loops and busy users, nearly always in
	// flight, that a hash pins to one engine.
	hot, hotTurns, hotWeight int
	name                     string
}

// turnsOf is conversation i's number of turns.
func (w affinityWorkload) turnsOf(i int) int {
	if i < w.hot {
		return w.hotTurns
	}
	return w.turns
}

// total is the workload's number of turns.
func (w affinityWorkload) total() int {
	return w.hot*w.hotTurns + (w.convs-w.hot)*w.turns
}

var affinitySpec = engineSpec{Slots: 4, TTFT: 10 * time.Millisecond, ITL: 4 * time.Millisecond, PrefillPerToken: 250 * time.Microsecond}

const (
	affinityEngines     = 4
	affinityCacheBlocks = 2048 // 32k tokens per engine: a quarter of the conversations fit, not all
	affinityBlockSize   = 16
)

// affinityFront is one front end under test.
type affinityFront struct {
	name string
	url  string
	// sy is the Switchyard broker's base URL, for its fleet view.
	sy string
}

// affinityResult is one front end's measurement.
type affinityResult struct {
	ttft    []float64 // ms, of every turn (timeouts and errors as the timeout)
	goodput float64   // turns/s meeting the SLO
	rate    float64   // offered turns/s
	errors  int
	// firstErr is the first error's text, for the log and the table.
	firstErr string
	hitRate  float64 // the engines' prefix_cache_hits / queries over the run
	oracle   float64 // the best achievable hit rate of the same turns
	// The counts behind the rates, to pool passes.
	good, turns                    int
	queries, hits, oracleHit, oAll float64
	p99s                           []float64 // each pass's p99, ms
	peakWaiting                    []float64
	dur                            time.Duration
	fleetAffinity                  string
}

// add pools pass r into res.
func (res *affinityResult) add(r *affinityResult) {
	res.ttft = append(res.ttft, r.ttft...)
	slices.Sort(res.ttft)
	res.good += r.good
	res.turns += r.turns
	res.dur += r.dur
	res.errors += r.errors
	if res.firstErr == "" {
		res.firstErr = r.firstErr
	}
	res.queries += r.queries
	res.hits += r.hits
	res.oracleHit += r.oracleHit
	res.oAll += r.oAll
	res.peakWaiting = append(res.peakWaiting, r.peakWaiting...)
	res.p99s = append(res.p99s, percentile(r.ttft, 99))
	res.fleetAffinity = r.fleetAffinity
	if res.dur > 0 {
		res.goodput = float64(res.good) / res.dur.Seconds()
		res.rate = float64(res.turns) / res.dur.Seconds()
	}
	if res.queries > 0 {
		res.hitRate = res.hits / res.queries
	}
	if res.oAll > 0 {
		res.oracle = res.oracleHit / res.oAll
	}
}

func (e *env) affinityScenario(d *doc) error {
	w := affinityWorkload{convs: 64, turns: 8, groups: 8, systemWords: 768, userWords: 96, outTokens: 32, load: 0.8}
	if e.quick {
		w.convs, w.turns = 32, 6
	}
	var engines, kvEndpoints []string
	for i := range affinityEngines {
		port, err := freePort()
		if err != nil {
			return err
		}
		ep := fmt.Sprintf("tcp://127.0.0.1:%d", port)
		p, err := e.sup.start(fmt.Sprintf("aff-engine%d", i+1), e.path("sim-engine"), "--listen", "127.0.0.1:0", "--model", model,
			"--ttft", affinitySpec.TTFT.String(), "--itl", affinitySpec.ITL.String(), "--slots", strconv.Itoa(affinitySpec.Slots),
			"--prefill-per-token", affinitySpec.PrefillPerToken.String(), "--enable-prefix-caching",
			"--prefix-cache-blocks", strconv.Itoa(affinityCacheBlocks), "--block-size", strconv.Itoa(affinityBlockSize),
			"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"`+ep+`"}`, "--log-level", "info")
		if err != nil {
			return err
		}
		m, err := p.waitFor(e.ctx, engineAddr, 20*time.Second)
		if err != nil {
			return err
		}
		engines = append(engines, m[1])
		kvEndpoints = append(kvEndpoints, ep)
	}
	if err := e.affinityCompare(d, w, engines, kvEndpoints, true); err != nil {
		return err
	}
	// The same fleet and load with hot conversations: what hashing does
	// badly.
	hot := w
	hot.name, hot.hot, hot.hotTurns, hot.hotWeight, hot.turns = "hot", 8, 24, 8, 6
	if e.quick {
		hot.hot, hot.hotTurns, hot.turns = 4, 12, 4
	}
	return e.affinityCompare(d, hot, engines, kvEndpoints, false)
}

// affinityCompare runs workload w against every front end and writes its
// table; main is the workload whose figures are the targets.
func (e *env) affinityCompare(d *doc, w affinityWorkload, engines, kvEndpoints []string, main bool) error {
	// Capacity with every conversation's earlier turns cached: the mean
	// turn prefills its new user message and the previous answer (and the
	// first turn of a group its system prompt).
	newTokens := float64(w.userWords+w.outTokens+4) + float64(w.systemWords)*float64(w.groups)/float64(w.total())
	svc := affinitySpec.TTFT + time.Duration(newTokens*float64(affinitySpec.PrefillPerToken)) + time.Duration(w.outTokens-1)*affinitySpec.ITL
	capacity := float64(affinityEngines*affinitySpec.Slots) / svc.Seconds()
	rate := w.load * capacity

	type setup struct {
		name     string
		start    func() (affinityFront, func(), error)
		isSwitch bool
	}
	sy := func(tag, mode string, precise bool) func() (affinityFront, func(), error) {
		return func() (affinityFront, func(), error) {
			b, err := e.startBroker("broker-"+tag, "", append([]string{"--slow-start", "0", "--affinity", mode}, strings.Fields(os.Getenv("BENCH_AFFINITY_ARGS"))...)...)
			if err != nil {
				return affinityFront{}, nil, err
			}
			var agents []*proc
			var ids []string
			for i, addr := range engines {
				id := fmt.Sprintf("%s-a%d", tag, i+1)
				args := []string{"--engine", "openai", "--engine-url", "http://" + addr, "--slots", strconv.Itoa(affinitySpec.Slots), "--slow-start", "0"}
				if precise {
					args = append(args, "--kv-events-endpoint", kvEndpoints[i])
				}
				p, err := e.startAgent(id, b.NATS, "", args...)
				if err != nil {
					return affinityFront{}, nil, err
				}
				agents = append(agents, p)
				ids = append(ids, id)
			}
			if err := e.waitEligible(b.HTTP, ids...); err != nil {
				return affinityFront{}, nil, err
			}
			stop := func() {
				for _, a := range agents {
					_ = a.stop(10 * time.Second)
				}
				_ = b.stop(10 * time.Second)
			}
			return affinityFront{name: "", url: b.HTTP, sy: b.HTTP}, stop, nil
		}
	}
	var nginxRR, nginxHash string
	setups := []setup{
		{"Switchyard affinity precise", sy("affp", "precise", true), true},
		{"Switchyard affinity approx", sy("affa", "approx", false), true},
		{"Switchyard pure pull", sy("affo", "off", false), true},
		{"nginx round robin", func() (affinityFront, func(), error) { return affinityFront{url: nginxRR}, func() {}, nil }, false},
		{"nginx hash on conversation", func() (affinityFront, func(), error) { return affinityFront{url: nginxHash}, func() {}, nil }, false},
	}
	if e.nginx != "" {
		var err error
		if nginxRR, nginxHash, err = e.startNginxHash("aff"+w.name, engines); err != nil {
			return err
		}
	} else {
		setups = setups[:3]
	}
	slo := 300 * time.Millisecond
	// Passes interleave the front ends, each pass with its own
	// conversations and arrivals, and pool each front end's turns: the p99
	// of one pass's 512 turns is its fifth-worst turn, which one stall of
	// this shared machine decides.
	passes := 3
	if e.quick {
		passes = 1
	}
	res := map[string]*affinityResult{}
	order := make([]string, len(setups))
	for i, s := range setups {
		order[i] = s.name
	}
	for pass := range passes {
		for k := range setups {
			// Each pass starts with the next front end, so none is always
			// the first after the engines' start or a nginx reload.
			i := (k + pass) % len(setups)
			s := setups[i]
			fe, stop, err := s.start()
			if err != nil {
				return fmt.Errorf("affinity %s: %w", s.name, err)
			}
			if err := e.waitIdle(engines); err != nil {
				stop()
				return err
			}
			e.logf("affinity: pass %d/%d: %s at %.1f turns/s", pass+1, passes, s.name, rate)
			r, err := e.affinityRun(fe, engines, w, rate, slo, fmt.Sprintf("%srun%d.%d", w.name, i, pass), pass)
			if err == nil && s.isSwitch {
				r.fleetAffinity = fleetAffinityLine(e.ctx, fe.sy)
			}
			stop()
			if err != nil {
				return fmt.Errorf("affinity %s: %w", s.name, err)
			}
			if res[s.name] == nil {
				res[s.name] = &affinityResult{}
			}
			res[s.name].add(r)
		}
	}
	var cdf []series
	for _, name := range order {
		cdf = append(cdf, series{name: name, values: res[name].ttft})
	}

	var b strings.Builder
	if main {
		fmt.Fprintf(&b, "## Prefix-cache affinity: multi-turn chat at %.0f%% of capacity\n\n", 100*w.load)
		fmt.Fprintf(&b, "Four sim-engines with vLLM-like prefix caching (`--enable-prefix-caching --prefix-cache-blocks %d --block-size %d`, LRU; KV events on ZMQ), "+
			"each %s: the first token costs TTFT plus the prefill of the *uncached* prompt tokens only. "+
			"Workload: %d conversations of %d turns in %d groups sharing a %d-word system prompt; each turn adds a %d-word user message and re-sends the whole conversation with the previous answers (up to %d tokens each). "+
			"Turns arrive as a Poisson process, each taking the next idle conversation, at %.0f%% of the capacity with every earlier turn cached "+
			"(mean service %s: %.0f new prompt tokens, %d output tokens; %d slots → %.1f turns/s): **%.1f turns/s**. "+
			"Each front end gets its own conversations (their system prompts differ), so no run finds another's cache. "+
			"%d passes interleave the front ends, each pass with its own conversations and arrivals (seeds 7 on); a front end's turns of every pass are pooled. "+
			"The engines' cache of %d blocks holds about a quarter of all conversations: an engine that sees every conversation (pull, round robin) evicts.\n\n",
			affinityCacheBlocks, affinityBlockSize, affinitySpec, w.convs, w.turns, w.groups, w.systemWords, w.userWords, w.outTokens,
			100*w.load, fmtDur(svc), newTokens, w.outTokens, affinityEngines*affinitySpec.Slots, capacity, rate, passes, affinityCacheBlocks)
	} else {
		fmt.Fprintf(&b, "### The same with hot conversations\n\n")
		fmt.Fprintf(&b, "The same engines, groups and load (**%.1f turns/s**), but %d of the %d conversations are hot: %d turns each against %d for the others, "+
			"and %d times as likely to take the next arrival while idle (agent loops, busy users), so they are nearly always in flight and their prompts grow longest. "+
			"A hash pins each to one engine whatever that engine's load; pull and affinity's guard do not. %d passes, pooled as above.\n\n",
			rate, w.hot, w.convs, w.hotTurns, w.turns, w.hotWeight, passes)
	}
	fmt.Fprintf(&b, "| front end | TTFT p50 | TTFT p90 | TTFT p99 | p99 of each pass | goodput (TTFT ≤ %s) | engines' prefix hit rate | best achievable | errors | peak queued in an engine | affinity (from /v1/fleet, last pass) |\n|---|---|---|---|---|---|---|---|---|---|---|\n", slo)
	for _, name := range order {
		r := res[name]
		pk := slices.Max(append(r.peakWaiting, 0))
		var p99s []string
		for _, v := range r.p99s {
			p99s = append(p99s, fmtMS(v))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f turns/s (%.0f%%) | %.0f%% | %.0f%% | %d | %d | %s |\n", name,
			fmtMS(percentile(r.ttft, 50)), fmtMS(percentile(r.ttft, 90)), fmtMS(percentile(r.ttft, 99)), strings.Join(p99s, " / "),
			r.goodput, 100*r.goodput/r.rate, 100*r.hitRate, 100*r.oracle, r.errors, int(pk), r.fleetAffinity)
	}
	for _, name := range order {
		if r := res[name]; r.errors > 0 {
			fmt.Fprintf(&b, "\n%s's first error: `%s`\n", name, r.firstErr)
		}
	}
	fmt.Fprintf(&b, "\nBest achievable is the share of prompt blocks some earlier turn of the same run had sent (an engine with an infinite cache shared by all). "+
		"Peak queued is the engines' own `vllm:num_requests_waiting` sampled every 100 ms: an agent never sends its engine more than its slots, so under Switchyard it stays 0.\n\n")
	img, title := "img/bench-affinity-ttft-cdf.svg", "TTFT, multi-turn chat at 80% load (CDF, log scale)"
	if !main {
		img, title = "img/bench-affinity-hot-ttft-cdf.svg", "TTFT, multi-turn chat with hot conversations at 80% load (CDF, log scale)"
	}
	if err := writeCDF(filepath.Join(d.out, img), title, cdf, true); err != nil {
		return err
	}
	fmt.Fprintf(&b, "![TTFT CDF of multi-turn chat per front end](%s)\n\n", img)
	d.add(b.String())

	// The targets are the default mode's (precise).
	pull, precise := res["Switchyard pure pull"], res["Switchyard affinity precise"]
	what := "affinity"
	if !main {
		what = "affinity (hot conversations)"
	}
	if main {
		d.target(what+" TTFT p50 vs pure pull", "<= half ("+fmtMS(percentile(pull.ttft, 50)/2)+")", fmtMS(percentile(precise.ttft, 50)), percentile(precise.ttft, 50) <= percentile(pull.ttft, 50)/2)
		d.target(what+" engines' hit rate vs best achievable", fmt.Sprintf(">= %.0f%% - 10", 100*precise.oracle), fmt.Sprintf("%.0f%%", 100*precise.hitRate), precise.hitRate >= precise.oracle-0.10)
	}
	if h, ok := res["nginx hash on conversation"]; ok {
		d.target(what+" TTFT p99 vs nginx hash", "< "+fmtMS(percentile(h.ttft, 99)), fmtMS(percentile(precise.ttft, 99)), percentile(precise.ttft, 99) < percentile(h.ttft, 99))
	}
	worst := 0.0
	for _, n := range []string{"Switchyard pure pull", "Switchyard affinity approx", "Switchyard affinity precise"} {
		worst = max(worst, slices.Max(append(res[n].peakWaiting, 0)))
	}
	d.target("no agent above its slots (engine queue under Switchyard)", "0", strconv.Itoa(int(worst)), worst == 0)
	return nil
}

// affinityConv is one conversation's state.
type affinityConv struct {
	id       string
	system   string
	msgs     []map[string]string
	turn     int
	turns    int
	weight   int      // its odds of taking an arrival against the others'
	user     []string // the user messages of each turn
	inFlight bool
}

// affinityRun drives the conversations against fe and measures.
func (e *env) affinityRun(fe affinityFront, engines []string, w affinityWorkload, rate float64, slo time.Duration, tag string, pass int) (*affinityResult, error) {
	rng := rand.New(rand.NewPCG(7+uint64(pass), 16))
	words := strings.Fields(strings.Repeat("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu ", 8))
	text := func(n int) string {
		out := make([]string, n)
		for i := range out {
			out[i] = words[rng.IntN(len(words))]
		}
		return strings.Join(out, " ")
	}
	systems := make([]string, w.groups)
	for g := range systems {
		systems[g] = fmt.Sprintf("%s group %d: %s", tag, g, text(w.systemWords))
	}
	convs := make([]*affinityConv, w.convs)
	for i := range convs {
		c := &affinityConv{id: fmt.Sprintf("%s-c%d", tag, i), system: systems[i%w.groups], turns: w.turnsOf(i), weight: 1}
		if i < w.hot {
			c.weight = w.hotWeight
		}
		for range c.turns {
			c.user = append(c.user, text(w.userWords))
		}
		c.msgs = []map[string]string{{"role": "system", "content": c.system}}
		convs[i] = c
	}
	q0, h0, err := prefixCounters(e.ctx, engines)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: newTransport(256)}
	timeout := 20 * time.Second
	total := w.total()
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	idle := func() []*affinityConv {
		var out []*affinityConv
		for _, c := range convs {
			if !c.inFlight && c.turn < c.turns {
				out = append(out, c)
			}
		}
		return out
	}
	seen := map[uint64]bool{} // the oracle's cache
	var oracleHit, oracleAll float64
	res := &affinityResult{rate: rate}
	sctx, stopSample := context.WithCancel(e.ctx)
	var sw sync.WaitGroup
	sw.Add(1)
	go func() { defer sw.Done(); res.peakWaiting, _ = sampleWaiting(sctx, engines) }()
	var wg sync.WaitGroup
	start := time.Now()
	next := start
	good := 0
	for sent := 0; sent < total; sent++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		mu.Lock()
		var ready []*affinityConv
		for ready = idle(); len(ready) == 0; ready = idle() {
			cond.Wait()
		}
		c := pickWeighted(rng, ready)
		c.inFlight = true
		c.msgs = append(c.msgs, map[string]string{"role": "user", "content": c.user[c.turn]})
		msgs := slices.Clone(c.msgs)
		// The oracle: blocks of this prompt some earlier turn sent.
		am := make([]affinity.Message, len(msgs))
		for i, m := range msgs {
			am[i] = affinity.Message{Role: m["role"], Content: m["content"]}
		}
		keys := affinity.AppendChatKeys(nil, affinityBlockSize, am)
		hit := 0
		for hit < len(keys) && seen[keys[hit]] {
			hit++
		}
		for _, k := range keys {
			seen[k] = true
		}
		oracleHit += float64(hit)
		oracleAll += float64(len(keys))
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ttft, answer, err := chatStream(e.ctx, client, fe.url, c.id, msgs, w.outTokens, timeout)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.errors++
				if res.firstErr == "" {
					res.firstErr = err.Error()
				}
				ttft = timeout
				answer = "(no answer)"
			} else if ttft <= slo {
				good++
			}
			res.ttft = append(res.ttft, float64(ttft)/float64(time.Millisecond))
			c.msgs = append(c.msgs, map[string]string{"role": "assistant", "content": answer})
			c.turn++
			c.inFlight = false
			cond.Broadcast()
		}()
	}
	wg.Wait()
	res.dur = time.Since(start)
	stopSample()
	sw.Wait()
	slices.Sort(res.ttft)
	res.goodput = float64(good) / res.dur.Seconds()
	res.rate = float64(total) / res.dur.Seconds()
	res.good, res.turns, res.oracleHit, res.oAll = good, total, oracleHit, oracleAll
	if oracleAll > 0 {
		res.oracle = oracleHit / oracleAll
	}
	q1, h1, err := prefixCounters(e.ctx, engines)
	if err != nil {
		return nil, err
	}
	res.queries, res.hits = q1-q0, h1-h0
	if q1 > q0 {
		res.hitRate = (h1 - h0) / (q1 - q0)
	}
	e.logf("affinity: p50 %s p99 %s hit %.0f%% (best %.0f%%) errors %d in %s", fmtMS(percentile(res.ttft, 50)), fmtMS(percentile(res.ttft, 99)),
		100*res.hitRate, 100*res.oracle, res.errors, res.dur.Round(time.Millisecond))
	if res.errors > 0 {
		e.logf("affinity: first error: %s", res.firstErr)
	}
	return res, nil
}

// chatStream sends one streaming chat turn and returns its TTFT and text.
func chatStream(ctx context.Context, c *http.Client, base, conv string, msgs []map[string]string, maxTokens int, timeout time.Duration) (time.Duration, string, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": maxTokens, "stream": true})
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Conversation-Id", conv)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("status %s", resp.Status)
	}
	var ttft time.Duration
	var text strings.Builder
	events := sse.NewReader(resp.Body, maxSSEEvent)
	for {
		e, err := events.Next()
		if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && string(e.Data) == "[DONE]") {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			return 0, "", err
		}
		if string(e.Data) == "[DONE]" {
			if ttft == 0 {
				return 0, "", fmt.Errorf("no token")
			}
			return ttft, strings.TrimSpace(text.String()), nil
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(e.Data, &ch) != nil {
			continue
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != "" && ttft == 0 {
				ttft = time.Since(start)
			}
			text.WriteString(c.Delta.Content)
		}
	}
	return 0, "", fmt.Errorf("stream ended without [DONE]")
}

// prefixCounters sums the engines' vllm:prefix_cache_queries_total and
// _hits_total.
func prefixCounters(ctx context.Context, engines []string) (queries, hits float64, err error) {
	for _, a := range engines {
		g, err := engineGauges(ctx, a)
		if err != nil {
			return 0, 0, err
		}
		queries += g["vllm:prefix_cache_queries_total"]
		hits += g["vllm:prefix_cache_hits_total"]
	}
	return queries, hits, nil
}

// fleetAffinityLine summarises a broker's /v1/fleet affinity of the
// regular pool: share by affinity and fallbacks.
func fleetAffinityLine(ctx context.Context, base string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/fleet", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var f struct {
		Models []struct {
			Affinity map[string]struct {
				Mode      string            `json:"mode"`
				Share     float64           `json:"share"`
				Fallbacks map[string]uint64 `json:"fallbacks"`
			} `json:"affinity"`
		} `json:"models"`
	}
	if json.NewDecoder(resp.Body).Decode(&f) != nil || len(f.Models) == 0 {
		return ""
	}
	a, ok := f.Models[0].Affinity["regular"]
	if !ok || a.Mode == "off" {
		return "off"
	}
	var fb []string
	for _, r := range []string{"no_match", "full", "imbalanced", "not_taken_in_time"} {
		fb = append(fb, fmt.Sprintf("%s %d", strings.ReplaceAll(r, "_", " "), a.Fallbacks[r]))
	}
	return fmt.Sprintf("%.0f%% by affinity; fallbacks: %s", 100*a.Share, strings.Join(fb, ", "))
}

// startNginxHash serves two ports in front of engines: round robin, and
// consistent hashing on the X-Conversation-Id header (what a user would
// configure for cache affinity without Switchyard).
func (e *env) startNginxHash(tag string, engines []string) (rr, hash string, err error) {
	dir := filepath.Join(e.tmp, "nginx-"+tag)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	prr, err := freePort()
	if err != nil {
		return "", "", err
	}
	ph, err := freePort()
	if err != nil {
		return "", "", err
	}
	var servers strings.Builder
	for _, a := range engines {
		fmt.Fprintf(&servers, "    server %s max_fails=0;\n", a)
	}
	location := `    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
      proxy_next_upstream off;
      tcp_nodelay on;
`
	conf := fmt.Sprintf(`# generated by go run ./bench
worker_processes 2;
daemon off;
master_process on;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  client_max_body_size 16m;
  upstream rr {
%[2]s    keepalive 256;
  }
  upstream hash {
    hash $http_x_conversation_id consistent;
%[2]s    keepalive 256;
  }
  server {
    listen 127.0.0.1:%[3]d;
%[5]s      proxy_pass http://rr;
    }
  }
  server {
    listen 127.0.0.1:%[4]d;
%[5]s      proxy_pass http://hash;
    }
  }
}
`, dir, servers.String(), prr, ph, location)
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return "", "", err
	}
	if _, err := e.sup.start("nginx-"+tag, e.nginx, "-e", filepath.Join(dir, "error.log"), "-p", dir, "-c", cfg); err != nil {
		return "", "", err
	}
	rr, hash = fmt.Sprintf("http://127.0.0.1:%d", prr), fmt.Sprintf("http://127.0.0.1:%d", ph)
	for _, u := range []string{rr, hash} {
		if err := e.waitHTTP(u + "/v1/models"); err != nil {
			return "", "", fmt.Errorf("nginx: %w", err)
		}
	}
	return rr, hash, nil
}

// pickWeighted picks one of convs with odds by their weight.
func pickWeighted(rng *rand.Rand, convs []*affinityConv) *affinityConv {
	sum := 0
	for _, c := range convs {
		sum += c.weight
	}
	n := rng.IntN(sum)
	for _, c := range convs {
		if n -= c.weight; n < 0 {
			return c
		}
	}
	return convs[len(convs)-1]
}
