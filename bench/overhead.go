package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-ai/switchyard/loadgen"
)

// frontend is one way of reaching the engines.
type frontend struct {
	name  string
	url   string
	hosts []string // direct: the engines, round-robined by the client
	pgids []int    // its processes, for CPU accounting
}

// frontSet starts n engines of spec and every front end before them.
func (e *env) frontSet(tag string, spec engineSpec, n int) ([]frontend, []string, []int, error) {
	var engines []string
	var enginePIDs []int
	for i := range n {
		a, err := e.startEngine(fmt.Sprintf("%s-engine%d", tag, i+1), spec)
		if err != nil {
			return nil, nil, nil, err
		}
		engines = append(engines, a)
		enginePIDs = append(enginePIDs, e.sup.last().pid())
	}
	sy, err := e.switchyard(tag, engines, slices.Repeat([]engineSpec{spec}, n), "", "--slow-start", "0")
	if err != nil {
		return nil, nil, nil, err
	}
	rr, lc, ngx, err := e.startNginx(tag, engines)
	if err != nil {
		return nil, nil, nil, err
	}
	hp, hpp, err := e.startHAProxy(tag, engines)
	if err != nil {
		return nil, nil, nil, err
	}
	return []frontend{
		{"direct", "http://" + engines[0], engines, nil},
		{"Switchyard", sy.url, nil, sy.pids()},
		{"nginx round robin", rr, nil, []int{ngx}},
		{"nginx least_conn", lc, nil, []int{ngx}},
		{"HAProxy leastconn", hp, nil, []int{hpp}},
	}, engines, enginePIDs, nil
}

type runKey struct {
	c  int
	fe string
}

// cpuUse is CPU seconds per second of wall time over a run.
type cpuUse struct{ fe, engines, client float64 }

// sweep runs every front end at every concurrency, front ends interleaved
// so that drift of the shared machine spreads over all of them.
func (e *env) sweep(phase string, fronts []frontend, enginePIDs []int, levels []int, window func(c int) time.Duration,
	warm time.Duration, maxTokens int, rawAt int) (map[runKey]*loadgen.Report, map[runKey]cpuUse, []series, error) {
	reps := map[runKey]*loadgen.Report{}
	cpus := map[runKey]cpuUse{}
	var cdf []series
	for _, c := range levels {
		for _, fe := range fronts {
			cfg := loadgen.Config{
				URL: fe.url, Model: model, Concurrency: c, Seed: 1,
				Duration: window(c), WarmupDuration: warm,
				PromptTokens: loadgen.Fixed(16), MaxTokens: loadgen.Fixed(maxTokens),
				Timeout: 60 * time.Second,
			}
			e.logf("overhead %s: %s at %d streams", phase, fe.name, c)
			t0, f0, e0, c0 := time.Now(), cpuSeconds(fe.pgids), cpuSeconds(enginePIDs), selfCPU()
			rep, raw, err := e.load(cfg, c == rawAt, fe.hosts...)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("overhead %s c=%d: %w", fe.name, c, err)
			}
			el := time.Since(t0).Seconds()
			reps[runKey{c, fe.name}] = rep
			cpus[runKey{c, fe.name}] = cpuUse{(cpuSeconds(fe.pgids) - f0) / el, (cpuSeconds(enginePIDs) - e0) / el, (selfCPU() - c0) / el}
			if c == rawAt {
				cdf = append(cdf, series{name: fe.name, values: ttfts(raw, 0)})
			}
		}
	}
	return reps, cpus, cdf, nil
}

// overhead measures what each front end adds over calling the engines
// directly: latency with engines paced so that the machine is not
// saturated at 64 streams, then the most tokens/s each relays with
// engines fast enough that the front end, not the engine, is the limit.
func (e *env) overhead(d *doc) error {
	const nEngines = 2
	latSpec := engineSpec{Slots: 512, TTFT: 0, ITL: 5 * time.Millisecond}
	tputSpec := engineSpec{Slots: 512, TTFT: 0, ITL: time.Millisecond}
	win, warm := 6*time.Second, time.Second
	if e.quick {
		win, warm = 3*time.Second, 500*time.Millisecond
	}
	latWindow := func(c int) time.Duration {
		if c == 1 {
			return 5 * win / 3 // one stream finishes few requests: give p99 more of them
		}
		return win
	}
	const latTokens, tputTokens = 16, 32

	fronts, _, pids, err := e.frontSet("lat", latSpec, nEngines)
	if err != nil {
		return err
	}
	latLevels := []int{1, 64, 256}
	lat, _, cdf, err := e.sweep("latency", fronts, pids, latLevels, latWindow, warm, latTokens, 64)
	if err != nil {
		return err
	}
	e.sup.stopAll()
	fronts, tputEngines, pids, err := e.frontSet("tput", tputSpec, nEngines)
	if err != nil {
		return err
	}
	tputLevels := []int{64, 256, 512}
	tput, cpus, _, err := e.sweep("throughput", fronts, pids, tputLevels, func(int) time.Duration { return win }, warm, tputTokens, 0)
	if err != nil {
		return err
	}

	var b strings.Builder
	fmt.Fprintf(&b, "## Overhead: the same engines behind each front end\n\n")
	fmt.Fprintf(&b, "%d sim-engines, each its own process on a loopback port. "+
		"\"direct\" sends each request to the next engine in turn from the client; Switchyard is the broker on its embedded NATS "+
		"with one worker-agent (`--engine openai`, `--slots` equal to the engine's) per engine; nginx (2 workers, `proxy_buffering off`, HTTP/1.1 "+
		"upstream keepalive; round robin and `least_conn`) and HAProxy (`nbthread 2`, `balance leastconn`, `http-reuse always`, `option http-no-delay`) proxy the same engines. "+
		"Closed-loop streams with 16-word prompts; %s measured after %s of warm-up per row (%s at one stream). "+
		"The load generator runs in the runner process on the same two cores as everything else.\n\n",
		nEngines, win, warm, latWindow(1))
	fmt.Fprintf(&b, "### Latency\n\nEngines: %s; %d output tokens per request. At 64 streams the engines ask for about %s tokens/s, well under what the machine relays, so added latency is the path's, not CPU queueing; at 256 streams (%s tokens/s) the machine is near its limit for the costlier paths.\n\n",
		latSpec, latTokens, fmtInt(64/latSpec.ITL.Seconds()), fmtInt(256/latSpec.ITL.Seconds()))
	fmt.Fprintf(&b, "| streams | front end | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | output tokens/s | requests | errors |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range latLevels {
		for _, fe := range fronts {
			r := lat[runKey{c, fe.name}]
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %d | %d |\n", c, fe.name,
				fmtMS(r.TTFT.P50), fmtMS(r.TTFT.P99), fmtMS(r.ITL.P50), fmtMS(r.ITL.P99),
				fmtInt(r.OutputTokensPerS), r.Requests, errCount(r))
		}
	}
	fmt.Fprintf(&b, "\nAdded over direct (front end minus direct at the same concurrency). The engine paces tokens on an absolute schedule, so a constant per-token path delay shows in TTFT only; added ITL is the path's jitter.\n\n")
	fmt.Fprintf(&b, "| streams | front end | added TTFT p50 | added TTFT p99 | added ITL p50 | added ITL p99 |\n|---|---|---|---|---|---|\n")
	for _, c := range latLevels {
		dr := lat[runKey{c, "direct"}]
		for _, fe := range fronts[1:] {
			r := lat[runKey{c, fe.name}]
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", c, fe.name,
				fmtDelta(r.TTFT.P50-dr.TTFT.P50), fmtDelta(r.TTFT.P99-dr.TTFT.P99),
				fmtDelta(r.ITL.P50-dr.ITL.P50), fmtDelta(r.ITL.P99-dr.ITL.P99))
		}
	}
	img := "img/bench-overhead-ttft-cdf.svg"
	if err := writeCDF(filepath.Join(d.out, img), "TTFT at 64 streams, same engines (CDF, log scale)", cdf, true); err != nil {
		return err
	}
	fmt.Fprintf(&b, "\n![TTFT CDF at 64 streams per front end](%s)\n\n", img)

	fmt.Fprintf(&b, "### Relayed tokens/s\n\nEngines: %s; %d output tokens per request. The highest output tokens/s over 64, 256 and 512 streams; client, front end and engines share the two cores, so direct is the ceiling of the machine, not of the engines.\n\n", tputSpec, tputTokens)
	fmt.Fprintf(&b, "| front end | 64 streams | 256 streams | 512 streams | max | of direct's max | front-end CPU at max | front-end CPU per token | engines' CPU per token | client CPU per token |\n|---|---|---|---|---|---|---|---|---|---|\n")
	best := map[string]float64{}
	for _, fe := range fronts {
		bestC := 0
		for _, c := range tputLevels {
			if t := tput[runKey{c, fe.name}].OutputTokensPerS; t > best[fe.name] {
				best[fe.name], bestC = t, c
			}
		}
		u := cpus[runKey{bestC, fe.name}]
		per := func(coreS float64) string { return fmt.Sprintf("%.1f µs", 1e6*coreS/best[fe.name]) }
		fmt.Fprintf(&b, "| %s | %s | %s | %s | **%s** | %.0f%% | %.2f cores | %s | %s | %s |\n", fe.name,
			fmtInt(tput[runKey{64, fe.name}].OutputTokensPerS), fmtInt(tput[runKey{256, fe.name}].OutputTokensPerS),
			fmtInt(tput[runKey{512, fe.name}].OutputTokensPerS), fmtInt(best[fe.name]), 100*best[fe.name]/best["direct"],
			u.fe, per(u.fe), per(u.engines), per(u.client))
	}
	fmt.Fprintf(&b, "\nCPU is read from /proc/<pid>/stat of every process of each party (utime+stime; nginx's and HAProxy's workers included, Switchyard is the broker and both agents) over the run at the concurrency of the maximum, divided by the tokens relayed; the client is the runner process (load generator).\n\n")
	fmt.Fprintf(&b, "| streams | front end | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | errors |\n|---|---|---|---|---|---|---|\n")
	for _, c := range tputLevels {
		for _, fe := range fronts {
			r := tput[runKey{c, fe.name}]
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %d |\n", c, fe.name,
				fmtMS(r.TTFT.P50), fmtMS(r.TTFT.P99), fmtMS(r.ITL.P50), fmtMS(r.ITL.P99), errCount(r))
		}
	}
	fmt.Fprintf(&b, "\nAt saturation the engines fall behind their 1 ms schedule and send the tokens that are due back to back, hence ITL p50 near 0.\n\n")

	// Targets.
	dr, s := lat[runKey{64, "direct"}], lat[runKey{64, "Switchyard"}]
	addP50, addP99 := s.TTFT.P50-dr.TTFT.P50, s.TTFT.P99-dr.TTFT.P99
	addITL := s.ITL.P50 - dr.ITL.P50
	nginxBest := max(best["nginx round robin"], best["nginx least_conn"])
	d.target("added TTFT p50 at 64 streams", "< 0.5 ms", fmtDelta(addP50), addP50 < 0.5)
	d.target("added TTFT p99 at 64 streams", "< 2 ms", fmtDelta(addP99), addP99 < 2)
	d.target("added ITL p50 at 64 streams", "< 0.050 ms (in absolute value: below zero means tokens arrive bunched)", fmtDelta(addITL), math.Abs(addITL) < 0.05)
	d1, s1 := lat[runKey{1, "direct"}], lat[runKey{1, "Switchyard"}]
	n1 := lat[runKey{1, "nginx round robin"}]
	d.note(fmt.Sprintf("At one stream Switchyard adds %s TTFT p50 (nginx %s) and %s ITL p50.",
		fmtDelta(s1.TTFT.P50-d1.TTFT.P50), fmtDelta(n1.TTFT.P50-d1.TTFT.P50), fmtDelta(s1.ITL.P50-d1.ITL.P50)))
	d.target("relayed output tokens/s vs nginx", ">= "+fmtInt(nginxBest), fmtInt(best["Switchyard"]), best["Switchyard"] >= nginxBest)
	d.add(b.String())

	if err := e.profile(d, tputEngines, slices.Repeat([]engineSpec{tputSpec}, nEngines), win); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	return nil
}

// ttfts returns the TTFT of each measured request in ms; with timeout > 0
// a request that timed out before its first token counts as timeout (so
// percentiles are lower bounds instead of leaving the worst out).
func ttfts(raw []loadgen.RawRecord, timeout time.Duration) []float64 {
	var v []float64
	for _, r := range raw {
		switch {
		case r.Error == "" && r.TTFTMS > 0:
			v = append(v, r.TTFTMS)
		case timeout > 0 && r.Error == string(loadgen.KindTimeout) && r.TTFTMS == 0:
			v = append(v, float64(timeout)/float64(time.Millisecond))
		case r.TTFTMS > 0:
			v = append(v, r.TTFTMS)
		}
	}
	slices.Sort(v)
	return v
}

func errCount(r *loadgen.Report) int {
	n := 0
	for _, v := range r.Errors {
		n += v
	}
	return n
}

// errText is errCount with the kinds when there are any: "14 (timeout 10,
// status 4)".
func errText(r *loadgen.Report) string {
	n := errCount(r)
	if n == 0 {
		return "0"
	}
	var kinds []string
	for k, v := range r.Errors {
		if v > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
		}
	}
	slices.Sort(kinds)
	return fmt.Sprintf("%d (%s)", n, strings.Join(kinds, ", "))
}
