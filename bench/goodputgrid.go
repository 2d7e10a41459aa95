package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The goodput grid: the highest Poisson arrival rate at which 90% of
// requests meet both targets, per dispatch mode, on cells that vary one
// axis at a time around a base cell (4 regular + 2 prefill + 2 decode
// engines, 16 slots, replayed prompts): the prompts, the slots, the
// fleet. A full product of the axes does not fit the hour the grid may
// take. Each cell sweeps capacity's rate first and measures every other
// mode at a few rates around capacity's goodput.

// gridCell is one cell of the grid.
type gridCell struct {
	axis, name string
	fleet      goodputFleet
	slots      int
	prompts    string // distinct, replayed or multiturn
	// regularArgs and prefillArgs are extra sim-engine flags of the
	// regular and the prefill engines: unlike engines.
	regularArgs, prefillArgs []string
}

// Unlike engines: prefill engines twice as fast at prefill as the
// regular ones, and regular engines 1.5 times slower at everything.
var (
	fastPrefill = []string{"--step-per-prefill-token", "20us"}
	slowRegular = []string{"--step-time", "9.6ms", "--step-per-seq", "60us", "--step-per-prefill-token", "60us"}
)

func gridCells() []gridCell {
	base := gridCell{axis: "base", name: "base", fleet: goodputFleet{4, 2, 2}, slots: 16, prompts: "replayed"}
	cells := []gridCell{base}
	with := func(axis, name string, f func(*gridCell)) {
		c := base
		c.axis, c.name = axis, name
		f(&c)
		cells = append(cells, c)
	}
	with("prompts", "distinct", func(c *gridCell) { c.prompts = "distinct" })
	with("prompts", "multi-turn", func(c *gridCell) { c.prompts = "multiturn" })
	for _, n := range []int{8, 32, 64} {
		with("slots", strconv.Itoa(n)+" slots", func(c *gridCell) { c.slots = n })
	}
	with("fleet", "6+1P+1D", func(c *gridCell) { c.fleet = goodputFleet{6, 1, 1} })
	with("fleet", "2+3P+3D", func(c *gridCell) { c.fleet = goodputFleet{2, 3, 3} })
	with("fleet", "4+2P+2D, prefill 2x faster", func(c *gridCell) { c.prefillArgs = fastPrefill })
	with("fleet", "4+2P+2D, regular 1.5x slower", func(c *gridCell) { c.regularArgs = slowRegular })
	return cells
}

// The modes each cell measures; threshold at every one of
// gridThresholds, the best of them in hindsight standing for it.
var (
	gridModes      = []string{"capacity", "count", "slo"}
	gridThresholds = []int{512, 2048, 8192}
)

// gridSweep is how a cell's rates are tried: from a start, multiplied by
// step while sustained and divided by it while missed, until the
// direction turns or at most max rates are measured, each for window.
type gridSweep struct {
	step   float64
	window time.Duration
}

// gridRates sweeps from start: it returns the highest rate sustained (0
// when none) and the points measured.
func (sw gridSweep) run(start float64, most int, measure func(rate float64) (goodputPoint, error)) (goodputResult, error) {
	var res goodputResult
	var lastUp *bool
	rate := start
	for range most {
		p, err := measure(rate)
		if err != nil {
			return res, err
		}
		res.points = append(res.points, p)
		up := p.attainment() >= goodFraction
		if up {
			res.goodput = max(res.goodput, rate)
		}
		if lastUp != nil && *lastUp != up {
			break // bracketed
		}
		lastUp = &up
		if up {
			rate = roundRate(rate * sw.step)
		} else {
			rate = roundRate(rate / sw.step)
		}
	}
	return res, nil
}

// roundRate rounds to half a request per second, at least half.
func roundRate(r float64) float64 { return max(0.5, math.Round(r*2)/2) }

// gridMode is one dispatch mode's broker flags.
func gridMode(mode string) (name string, args []string) {
	if t, ok := strings.CutPrefix(mode, "threshold-"); ok {
		return "threshold", []string{"--pd-threshold", t}
	}
	return mode, nil
}

func (e *env) goodput(d *doc) error {
	cells := gridCells()
	modes := slices.Clone(gridModes)
	for _, t := range gridThresholds {
		modes = append(modes, "threshold-"+strconv.Itoa(t))
	}
	sw := gridSweep{step: 1.2, window: 10 * time.Second}
	guess := e.goodputStart
	if len(e.goodputModes) > 0 {
		modes = e.goodputModes
	}
	if e.quick {
		sw.window, guess = 4*time.Second, 8
		cells = cells[:2]
	}
	results := map[string]goodputResult{} // cell name / mode
	for ci, c := range cells {
		for mi, mode := range modes {
			// Capacity sweeps from the guess; the other modes from
			// capacity's goodput, or from the guess when it is not measured.
			start, most := guess, 4
			if r, ok := results[c.name+"/capacity"]; ok && mi > 0 && len(r.points) > 0 {
				start, most = r.goodput, 3
				if start == 0 {
					start = r.points[len(r.points)-1].rate
				}
			}
			e.logf("goodput grid: %s, %s from %g requests/s", c.name, mode, start)
			r, err := e.gridRun(c, uint64(ci), mode, sw, start, most)
			e.sup.stopAll()
			if err != nil {
				return fmt.Errorf("%s %s: %w", c.name, mode, err)
			}
			results[c.name+"/"+mode] = r
			e.logf("goodput grid: %s, %s: %g (%s)", c.name, mode, r.goodput, r.describe())
		}
		if ci == 0 {
			if g := results[c.name+"/capacity"].goodput; g > 0 {
				guess = g
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Goodput by dispatch mode: the grid\n\n")
	fmt.Fprintf(&b, "Cells vary one axis at a time around the base cell (4 regular + 2 prefill + 2 decode engines, 16 slots, replayed prompts). "+
		"Engines: `sim-engine --batch-model --enable-prefix-caching` (6.4 ms + 40 µs per running sequence + 40 µs per prefilled token, 8,192 tokens a step; "+
		"unlike engines: prefill engines at 20 µs a prefilled token, or regular engines at 9.6 ms + 60 µs + 60 µs), each behind its own worker-agent with as many slots, "+
		"vLLM hand-off. Workload: 70%% chat (20-300 words in, 50-250 tokens out), 30%% documents (4,000-12,000 words in, 100-200 tokens out), Poisson arrivals, "+
		"%s per rate; replayed prompts start a list of 2,000 from its first on every rate, as loadgen replays a file; multi-turn conversations of 2-5 turns re-send the conversation "+
		"(the assistant turns are synthetic text). Goodput is the highest rate (requests/s) at which at least %.0f%% of requests met TTFT <= %s and TPOT <= %s; "+
		"capacity's rate is swept first (x%g steps, up to 4 rates), every other mode from capacity's goodput (up to 3 rates). "+
		"threshold is the best of --pd-threshold %v in hindsight. `<r` means every rate measured missed, the lowest being r; `>=r` that the highest rate measured, r, was sustained.\n\n",
		sw.window, goodFraction*100, goodTTFT, goodTPOT, sw.step, gridThresholds)
	cellGoodput := func(c gridCell, mode string) (float64, string) {
		r := results[c.name+"/"+mode]
		if len(r.points) == 0 {
			return 0, ""
		}
		byRate := func(a, b goodputPoint) int { return int(math.Copysign(1, a.rate-b.rate)) }
		if r.goodput == 0 {
			return 0, fmt.Sprintf("<%g", slices.MinFunc(r.points, byRate).rate)
		}
		if r.goodput == slices.MaxFunc(r.points, byRate).rate {
			return r.goodput, fmt.Sprintf(">=%g", r.goodput) // the sweep stopped before a miss
		}
		return r.goodput, fmt.Sprintf("%g", r.goodput)
	}
	for _, axis := range []string{"prompts", "slots", "fleet"} {
		fmt.Fprintf(&b, "### Axis: %s\n\n| cell | capacity | count | threshold (best) | slo | slo / max(capacity, count) | slo / count | slo / threshold |\n|---|---:|---:|---:|---:|---:|---:|---:|\n", axis)
		for _, c := range cells {
			if c.axis != axis && c.axis != "base" {
				continue
			}
			capG, capS := cellGoodput(c, "capacity")
			cntG, cntS := cellGoodput(c, "count")
			sloG, sloS := cellGoodput(c, "slo")
			thrG, thrS := 0.0, ""
			for _, t := range gridThresholds {
				g, s := cellGoodput(c, "threshold-"+strconv.Itoa(t))
				if thrS == "" || g > thrG {
					thrG, thrS = g, s+fmt.Sprintf(" (%d)", t)
				}
			}
			ratio := func(a, b float64) string {
				if b <= 0 {
					return ""
				}
				return fmt.Sprintf("%.2f", a/b)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", c.name, capS, cntS, thrS, sloS, ratio(sloG, max(capG, cntG)), ratio(sloG, cntG), ratio(sloG, thrG))
		}
		fmt.Fprintf(&b, "\n")
	}
	fmt.Fprintf(&b, "Every rate measured, as rate: attainment (failed requests; the machine's CPU use):\n\n| cell | mode | goodput | rates |\n|---|---|---:|---|\n")
	for _, c := range cells {
		for _, mode := range modes {
			if r, ok := results[c.name+"/"+mode]; ok {
				_, s := cellGoodput(c, mode)
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.name, mode, s, r.describe())
			}
		}
	}
	fmt.Println(b.String())
	d.add(b.String())
	return nil
}

// gridRun starts cell c's fleet under mode and sweeps the rate from
// start, measuring at most most rates.
func (e *env) gridRun(c gridCell, seed uint64, mode string, sw gridSweep, start float64, most int) (goodputResult, error) {
	name, args := gridMode(mode)
	g, err := e.goodputBroker(name, c.slots, append([]string{"--slow-start", "0"}, args...)...)
	if err != nil {
		return goodputResult{}, err
	}
	var ids []string
	for _, n := range []struct {
		role   string
		prefix string
		count  int
		args   []string
	}{{"regular", "r", c.fleet.regular, c.regularArgs}, {"prefill", "p", c.fleet.prefill, c.prefillArgs}, {"decode", "d", c.fleet.decode, nil}} {
		for i := range n.count {
			id := fmt.Sprintf("%s%d", n.prefix, i+1)
			if err := g.add(id, n.role, append([]string{"--enable-prefix-caching"}, n.args...), []string{"--slow-start", "0"}); err != nil {
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
	// The warm-up: the workload's first requests at once, from which the
	// broker learns every route's figures.
	warm := newGridWorkload(c.prompts, seed, 1<<20)
	var wg sync.WaitGroup
	for range 16 {
		w := warm.next()
		wg.Go(func() { _, _ = goodputRequest(e.ctx, client, g.br.HTTP, w) })
	}
	wg.Wait()
	return sw.run(start, most, func(rate float64) (goodputPoint, error) {
		if err := e.ctx.Err(); err != nil {
			return goodputPoint{}, err
		}
		// The same arrivals and prompts for every mode at a rate.
		w := newGridWorkload(c.prompts, seed, uint64(rate*2))
		return e.goodputRate(client, g.br.HTTP, w, rate, sw.window), nil
	})
}

func goodputClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true}}
}

// goodputReq is one request of the mix: earlier turns, alternately the
// user's and the assistant's, then the prompt.
type goodputReq struct {
	history   []string
	prompt    string
	maxTokens int
}

func (w goodputReq) body() ([]byte, error) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := make([]msg, 0, len(w.history)+1)
	for i, h := range w.history {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, h})
	}
	msgs = append(msgs, msg{"user", w.prompt})
	return json.Marshal(struct {
		Model     string `json:"model"`
		Messages  []msg  `json:"messages"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
	}{model, msgs, w.maxTokens, true})
}

var goodputVocab = []string{"the", "report", "describes", "a", "river", "system", "with", "seasonal", "floods", "and", "dry", "summers"}

// goodputText is words words, the first of them first.
func goodputText(rng *rand.Rand, first string, words int) string {
	var sb strings.Builder
	sb.WriteString(first)
	for w := 1; w < words; w++ {
		sb.WriteByte(' ')
		sb.WriteString(goodputVocab[rng.IntN(len(goodputVocab))])
	}
	return sb.String()
}

// goodputWork is one request of the mix: a chat turn, or (long) a long
// document to summarize, its prompt starting with first.
func goodputWork(rng *rand.Rand, first string, long bool) goodputReq {
	words, out := 20+rng.IntN(281), 50+rng.IntN(201)
	if long {
		words, out = 4000+rng.IntN(8001), 100+rng.IntN(101)
	}
	return goodputReq{prompt: goodputText(rng, first, words), maxTokens: out}
}

// gridWorkload yields one rate window's requests and arrival gaps.
type gridWorkload struct {
	kind   string
	rng    *rand.Rand
	id     string
	i      int
	replay []goodputReq
	convs  []*gridConv
}

// gridConv is a conversation in progress: its turns so far and how many
// it will have.
type gridConv struct {
	turns []string
	left  int
}

// gridReplayed is the list replayed prompts come from, per cell.
var (
	gridReplayMu sync.Mutex
	gridReplayed = map[uint64][]goodputReq{}
)

func newGridWorkload(kind string, cell, window uint64) *gridWorkload {
	w := &gridWorkload{kind: kind, rng: rand.New(rand.NewPCG(cell, window)), id: fmt.Sprintf("c%dw%d", cell, window)}
	if kind == "replayed" {
		gridReplayMu.Lock()
		defer gridReplayMu.Unlock()
		if gridReplayed[cell] == nil {
			rng := rand.New(rand.NewPCG(cell, 0))
			for i := range 2000 {
				gridReplayed[cell] = append(gridReplayed[cell], goodputWork(rng, fmt.Sprintf("c%dprompt%d", cell, i), rng.Float64() < 0.3))
			}
		}
		w.replay = gridReplayed[cell]
	}
	return w
}

// gap is the time to the next arrival at rate.
func (w *gridWorkload) gap(rate float64) time.Duration {
	return time.Duration(w.rng.ExpFloat64() / rate * float64(time.Second))
}

func (w *gridWorkload) next() goodputReq {
	i := w.i
	w.i++
	switch w.kind {
	case "replayed":
		return w.replay[i%len(w.replay)]
	case "multiturn":
		// Up to 16 conversations at once, each of 2-5 turns: a chat or a
		// document first, then short questions about it.
		if len(w.convs) < 16 {
			first := goodputWork(w.rng, fmt.Sprintf("%sconv%d", w.id, i), w.rng.Float64() < 0.3)
			w.convs = append(w.convs, &gridConv{turns: []string{first.prompt}, left: 1 + w.rng.IntN(4)})
			return first
		}
		k := w.rng.IntN(len(w.convs))
		c := w.convs[k]
		c.turns = append(c.turns, goodputText(w.rng, "answer", 50+w.rng.IntN(201)))
		q := goodputText(w.rng, "question", 10+w.rng.IntN(51))
		req := goodputReq{history: slices.Clone(c.turns), prompt: q, maxTokens: 50 + w.rng.IntN(201)}
		c.turns = append(c.turns, q)
		if c.left--; c.left == 0 {
			w.convs = slices.Delete(w.convs, k, k+1)
		}
		return req
	default:
		return goodputWork(w.rng, fmt.Sprintf("%sreq%d", w.id, i), w.rng.Float64() < 0.3)
	}
}

// goodputRate sends w's Poisson arrivals at rate for window and waits
// for every answer.
func (e *env) goodputRate(client *http.Client, base string, w *gridWorkload, rate float64, window time.Duration) goodputPoint {
	p := goodputPoint{rate: rate}
	var mu sync.Mutex
	var wg sync.WaitGroup
	busy0, all0 := machineCPU()
	end := time.Now().Add(window)
	for time.Now().Before(end) && e.ctx.Err() == nil {
		req := w.next()
		p.sent++
		wg.Go(func() {
			met, failed := goodputRequest(e.ctx, client, base, req)
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
		case <-time.After(w.gap(rate)):
		}
	}
	busy1, all1 := machineCPU()
	if all1 > all0 {
		p.busy = float64(busy1-busy0) / float64(all1-all0)
	}
	wg.Wait()
	return p
}
