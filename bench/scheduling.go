package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-ai/switchyard/internal/promtext"
	"github.com/switchyard-ai/switchyard/loadgen"
	"github.com/switchyard-ai/switchyard/simengine"
)

// scheduling measures how well each front end spreads Poisson arrivals
// over a heterogeneous fleet at about 90% of its capacity.
func (e *env) scheduling(d *doc) error {
	specs := []engineSpec{
		{Slots: 4, TTFT: 20 * time.Millisecond, ITL: 8 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond},
		{Slots: 4, TTFT: 20 * time.Millisecond, ITL: 4 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond},
		{Slots: 8, TTFT: 20 * time.Millisecond, ITL: 4 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond},
		{Slots: 16, TTFT: 20 * time.Millisecond, ITL: 2 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond},
	}
	const promptWords, outTokens, load = 100, 64, 0.9
	prompts, promptTokens, err := fullLengthPrompts(200, promptWords, outTokens)
	if err != nil {
		return err
	}
	var engines []string
	for i, s := range specs {
		a, err := e.startEngine(fmt.Sprintf("sched-engine%d", i+1), s)
		if err != nil {
			return err
		}
		engines = append(engines, a)
	}
	// Capacity: each engine completes slots / service-time requests per
	// second, service time = TTFT + prompt tokens * prefill + (out-1) * ITL.
	var capTotal float64
	var capLines []string
	for i, s := range specs {
		svc := s.TTFT + time.Duration(promptTokens)*s.PrefillPerToken + time.Duration(outTokens-1)*s.ITL
		c := float64(s.Slots) / svc.Seconds()
		capTotal += c
		capLines = append(capLines, fmt.Sprintf("| engine %d | %d | %s | %s | %.1f req/s |", i+1, s.Slots, s.ITL, fmtDur(svc), c))
	}
	rate := load * capTotal

	sy, err := e.switchyard("sched", engines, specs, "", "--slow-start", "0")
	if err != nil {
		return err
	}
	rr, lc, _, err := e.startNginx("sched", engines)
	if err != nil {
		return err
	}
	hp, _, err := e.startHAProxy("sched", engines)
	if err != nil {
		return err
	}
	fronts := []frontend{{name: "Switchyard", url: sy.url}, {name: "nginx round robin", url: rr}, {name: "nginx least_conn", url: lc}, {name: "HAProxy leastconn", url: hp}}
	dur, warm, timeout := 12*time.Second, 2*time.Second, 15*time.Second
	if e.quick {
		dur, warm, timeout = 5*time.Second, time.Second, 8*time.Second
	}
	slo := loadgen.SLO{TTFT: 500 * time.Millisecond, TPOT: 50 * time.Millisecond}

	type result struct {
		rep   *loadgen.Report
		p99   float64 // with timeouts before the first token counted as the timeout
		peaks []float64
		means []float64
	}
	res := map[string]result{}
	var cdf []series
	for _, fe := range fronts {
		if err := e.waitIdle(engines); err != nil {
			return err
		}
		cfg := loadgen.Config{
			URL: fe.url, Model: model, Rate: rate, Seed: 7, Duration: dur, WarmupDuration: warm,
			Prompts: prompts, MaxTokens: loadgen.Fixed(outTokens), SLO: slo, Timeout: timeout,
		}
		e.logf("scheduling: %s at %.1f req/s", fe.name, rate)
		sctx, stop := context.WithCancel(e.ctx)
		var peaks, means []float64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); peaks, means = sampleWaiting(sctx, engines) }()
		rep, raw, err := e.load(cfg, true)
		stop()
		wg.Wait()
		if err != nil {
			return fmt.Errorf("scheduling %s: %w", fe.name, err)
		}
		v := ttfts(raw, timeout)
		cdf = append(cdf, series{name: fe.name, values: v})
		res[fe.name] = result{rep, percentile(v, 99), peaks, means}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "## Scheduling quality: a heterogeneous fleet at %.0f%% of capacity\n\n", 100*load)
	fmt.Fprintf(&b, "Four sim-engines, each its own process; every engine queues requests beyond its slots (FIFO), so a front end that overloads one engine shows it as TTFT. "+
		"All have TTFT 20 ms plus 100 µs per prompt token. Requests: %d distinct chat prompts of %d words (%d prompt tokens once rendered), each chosen so that the simulator generates exactly %d tokens (no early stop), the same prompts in the same order at the same Poisson arrival times (seed 7) for every front end.\n\n",
		len(prompts), promptWords, promptTokens, outTokens)
	fmt.Fprintf(&b, "| engine | slots | ITL | service time (TTFT + %d×prefill + %d×ITL) | capacity (slots / service time) |\n|---|---|---|---|---|\n%s\n| fleet | | | | **%.1f req/s** |\n\n",
		promptTokens, outTokens-1, strings.Join(capLines, "\n"), capTotal)
	fmt.Fprintf(&b, "Offered load: %.0f%% × %.1f = **%.1f req/s** (%s output tokens/s), %s measured after %s of warm-up; per-request timeout %s. "+
		"Goodput counts requests meeting TTFT ≤ %s and TPOT ≤ %s. Switchyard: one agent per engine with `--slots` equal to the engine's, dispatch mode capacity; "+
		"round robin sends every engine a quarter of the load, %.1f req/s, against the slowest engine's %.1f.\n\n",
		100*load, capTotal, rate, fmtInt(rate*outTokens), dur, warm, timeout, slo.TTFT, slo.TPOT, rate/4, float64(specs[0].Slots)/(specs[0].TTFT+time.Duration(promptTokens)*specs[0].PrefillPerToken+time.Duration(outTokens-1)*specs[0].ITL).Seconds())
	fmt.Fprintf(&b, "| front end | TTFT p50 | TTFT p90 | TTFT p99 | TPOT p99 | goodput | goodput / offered | requests | timeouts | other errors | peak queued per engine (1/2/3/4) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, fe := range fronts {
		r := res[fe.name]
		p99 := fmtMS(r.p99)
		if r.rep.Errors[loadgen.KindTimeout] > 0 && r.p99 >= float64(timeout.Milliseconds()) {
			p99 = "≥ " + p99 + " (timeouts)"
		}
		var pk []string
		for _, p := range r.peaks {
			pk = append(pk, strconv.Itoa(int(p)))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f req/s | %.0f%% | %d | %d | %d | %s |\n", fe.name,
			fmtMS(r.rep.TTFT.P50), fmtMS(r.rep.TTFT.P90), p99, fmtMS(r.rep.TPOT.P99), r.rep.GoodputPerS,
			100*r.rep.GoodputPerS/rate, r.rep.Requests, r.rep.Errors[loadgen.KindTimeout], errCount(r.rep)-r.rep.Errors[loadgen.KindTimeout],
			strings.Join(pk, "/"))
	}
	fmt.Fprintf(&b, "\nTTFT percentiles of the loadgen report cover requests that produced a first token; TTFT p99 here also counts a request that timed out before its first token as the timeout, so it is a lower bound when timeouts occur. "+
		"Peak queued is the engine's own `vllm:num_requests_waiting`, sampled every 100 ms.\n\n")
	img := "img/bench-scheduling-ttft-cdf.svg"
	if err := writeCDF(filepath.Join(d.out, img), "TTFT, heterogeneous fleet at 90% load (CDF, log scale)", cdf, true); err != nil {
		return err
	}
	fmt.Fprintf(&b, "![TTFT CDF on the heterogeneous fleet per front end](%s)\n\n", img)
	s, r := res["Switchyard"].p99, res["nginx round robin"].p99
	d.target("heterogeneous p99 TTFT vs round robin", "<= half ("+fmtMS(r/2)+")", fmtMS(s), s <= r/2)
	d.add(b.String())
	return nil
}

// fullLengthPrompts makes n chat prompts of words words for which the
// simulator generates exactly out tokens (it stops some sequences early,
// as a model emits EOS), so every request costs the same service time.
func fullLengthPrompts(n, words, out int) ([]loadgen.Prompt, int, error) {
	rng := rand.New(rand.NewPCG(42, 8))
	vocab := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu")
	var ps []loadgen.Prompt
	promptTokens := 0
	for tries := 0; len(ps) < n; tries++ {
		if tries > 100*n {
			return nil, 0, fmt.Errorf("only %d of %d full-length prompts", len(ps), n)
		}
		w := make([]string, words)
		for i := range w {
			w[i] = vocab[rng.IntN(len(vocab))]
		}
		text := strings.Join(w, " ")
		msgs, _ := json.Marshal([]map[string]string{{"role": "user", "content": text}})
		body, _ := json.Marshal(map[string]any{"model": model, "messages": json.RawMessage(msgs), "max_tokens": out})
		x, err := simengine.Expect(simengine.APIChat, body)
		if err != nil {
			return nil, 0, err
		}
		if x.CompletionTokens != out || x.FinishReason != "length" {
			continue
		}
		promptTokens = x.PromptTokens
		ps = append(ps, loadgen.Prompt{Messages: msgs})
	}
	return ps, promptTokens, nil
}

// waitIdle waits until no engine runs or queues a request, so that one
// front end's leftovers do not load the next one's run.
func (e *env) waitIdle(engines []string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		busy := 0.0
		for _, a := range engines {
			m, err := engineGauges(e.ctx, a)
			if err != nil {
				return err
			}
			busy += m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"]
		}
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("engines still busy (%v requests) after 60s", busy)
		}
		select {
		case <-e.ctx.Done():
			return e.ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sampleWaiting samples each engine's queue until ctx ends and returns the
// peak and mean per engine.
func sampleWaiting(ctx context.Context, engines []string) (peaks, means []float64) {
	peaks, means = make([]float64, len(engines)), make([]float64, len(engines))
	n := 0
	for ctx.Err() == nil {
		for i, a := range engines {
			m, err := engineGauges(ctx, a)
			if err != nil {
				continue
			}
			w := m["vllm:num_requests_waiting"]
			peaks[i] = max(peaks[i], w)
			means[i] += w
		}
		n++
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	for i := range means {
		means[i] /= float64(max(n, 1))
	}
	return peaks, means
}

// engineGauges reads an engine's metrics, each summed over its series.
func engineGauges(ctx context.Context, addr string) (map[string]float64, error) {
	m, err := promtext.Fetch(ctx, nil, "http://"+addr+"/metrics")
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(m))
	for name := range m {
		out[name] = m.Sum(name)
	}
	return out, nil
}
