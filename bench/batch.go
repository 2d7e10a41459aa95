package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/oaiformat/sse"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// The batch scenario's engines run the batch model's defaults (one H100
// serving Llama-3.1-8B) slowed batchSlowdown times, so that a loaded
// 2-core machine relays every token on time; its goodput targets are
// goodTTFT and the goodput scenario's TPOT target slowed alike.
const (
	batchSlowdown = 8
	batchTPOT     = batchSlowdown * goodTPOT
)

// batchEngineArgs are the engines' batch-model timings.
func batchEngineArgs() []string {
	m := simengine.DefaultBatchModel()
	return []string{"--step-time", (batchSlowdown * m.StepTime).String(), "--step-per-seq", (batchSlowdown * m.StepPerSeq).String(),
		"--step-per-prefill-token", (batchSlowdown * m.StepPerPrefillToken).String()}
}

// batchPlan is the batch scenario's shape: the fleet, the alternation of
// interactive bursts and idle stretches, and the batch work.
type batchPlan struct {
	engines     int
	burst, idle time.Duration
	// aloneCycles and withCycles are the burst+idle cycles of the run
	// without and with batch work.
	aloneCycles, withCycles int
	batches                 int
	lines                   int // per batch
	burstFraction           float64
	idleFraction            float64
	probeWindow             time.Duration
}

func (e *env) batchPlan() batchPlan {
	p := batchPlan{engines: 2, burst: 90 * time.Second, idle: 90 * time.Second, aloneCycles: 1, withCycles: 2, batches: 3, lines: 1000,
		burstFraction: 0.8, idleFraction: 0.1, probeWindow: 10 * time.Second}
	if e.quick {
		p.burst, p.idle, p.lines, p.probeWindow = 20*time.Second, 20*time.Second, 100, 5*time.Second
	}
	return p
}

// interactiveSample is one interactive request of a run.
type interactiveSample struct {
	sent       time.Time
	burst      bool
	ttft, tpot time.Duration // tpot is zero for an answer of one token
	failed     bool
}

// slotSample is the ready agents' slots at one moment, as their last
// heartbeats say: every slot, those interactive jobs hold and those batch
// jobs hold.
type slotSample struct {
	at                        time.Time
	slots, interactive, batch int
}

// batchScenario measures interactive latency on a fleet of batch-model
// engines with and without batch work beside it, how much of the idle
// capacity the batch work used, and that every line was answered once.
func (e *env) batchScenario(d *doc) error {
	plan := e.batchPlan()
	g, err := e.batchFleet(plan)
	if err != nil {
		return err
	}
	client := goodputClient()
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(53, 1))
	warmFleet(e, client, g.br.HTTP, rng)

	e.logf("batch: probing the fleet's goodput")
	goodput, probe := e.batchGoodput(client, g.br.HTTP, rng, plan)
	if goodput == 0 {
		return fmt.Errorf("the fleet sustained no rate (%s)", probe)
	}
	burstRate, idleRate := plan.burstFraction*goodput, plan.idleFraction*goodput
	e.logf("batch: goodput %g requests/s; bursts at %.1f, idle at %.1f", goodput, burstRate, idleRate)

	e.logf("batch: interactive load alone")
	alone, aloneSlots := e.batchRun(client, g.br.HTTP, g.br.NATS, rng, plan.aloneCycles, plan, burstRate, idleRate, nil)

	e.logf("batch: interactive load with %d batches of %d lines", plan.batches, plan.lines)
	inputs := make([][]byte, plan.batches)
	for i := range inputs {
		inputs[i] = batchInput(rng, i, plan.lines)
	}
	bw := &batchWork{e: e, client: client, base: g.br.HTTP, inputs: inputs}
	with, withSlots := e.batchRun(client, g.br.HTTP, g.br.NATS, rng, plan.withCycles, plan, burstRate, idleRate, bw)
	if bw.submitErr != nil {
		return fmt.Errorf("batch work: %w", bw.submitErr)
	}
	a, w := interactiveStats(alone), interactiveStats(with)
	share, idleSS, batchSS := idleShare(withSlots, bw.started, bw.finished)
	_, aloneIdle, _ := idleShare(aloneSlots, time.Time{}, time.Time{})

	var b strings.Builder
	fmt.Fprintf(&b, "## Benchmark\n\n")
	fmt.Fprintf(&b, "Measured by `go run ./bench --only batch`%s on a shared 2-core machine under other load (load average %s when the batches were submitted), so the figures move between runs. "+
		"Fleet: %d `sim-engine --batch-model` processes, 16 slots each, each behind its own worker-agent (16 slots), one broker; the engines run the batch model's defaults (Llama-3.1-8B on one H100) slowed %d times (`%s`), "+
		"so that every token is relayed on time here, and a step lasts longer the more sequences it decodes: batch decodes slow the interactive ones beside them. "+
		"Interactive load: streamed chat requests (20-300 words in, up to 50-250 tokens out; the simulator ends about one sequence in 40 at each token), "+
		"Poisson arrivals alternating %s bursts at %.0f%% of the fleet's goodput (%.1f requests/s) with %s idle stretches at %.0f%% (%.1f requests/s); %d cycle(s) alone, then %d with batch work. "+
		"Goodput, the highest rate at which 90%% of requests had TTFT <= %s and TPOT <= %s, was probed first: %g requests/s (rate: share meeting both: %s). "+
		"Batch work: %d batches of %d chat lines (50-200 words in, up to 100-400 tokens out, not streamed) uploaded with `POST /v1/files` and submitted with `POST /v1/batches` as the second run starts; "+
		"that run goes on with idle stretches until every batch has ended.\n\n",
		e.quickNote(), bw.load0, plan.engines, batchSlowdown, strings.Join(batchEngineArgs(), " "), plan.burst, plan.burstFraction*100, burstRate, plan.idle, plan.idleFraction*100, idleRate,
		plan.aloneCycles, plan.withCycles, goodTTFT, batchTPOT, goodput, probe, plan.batches, plan.lines)
	fmt.Fprintf(&b, "| interactive | requests | failed | TTFT p50 | TTFT p95 | TTFT p99 | TPOT p95 | burst TTFT p95 | burst TPOT p95 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range []struct {
		name string
		s    batchStats
	}{{"alone", a}, {"with batch work", w}} {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s |\n", r.name, r.s.n, r.s.failed,
			fmtDur(r.s.ttft50), fmtDur(r.s.ttft95), fmtDur(r.s.ttft99), fmtDur(r.s.tpot95), fmtDur(r.s.burstTTFT95), fmtDur(r.s.burstTPOT95))
	}
	pct := func(x, y time.Duration) float64 {
		if y == 0 {
			return 0
		}
		return 100 * (float64(x)/float64(y) - 1)
	}
	fmt.Fprintf(&b, "| change | | | %+.0f%% | %+.0f%% | %+.0f%% | %+.0f%% | %+.0f%% | %+.0f%% |\n\n",
		pct(w.ttft50, a.ttft50), pct(w.ttft95, a.ttft95), pct(w.ttft99, a.ttft99), pct(w.tpot95, a.tpot95), pct(w.burstTTFT95, a.burstTTFT95), pct(w.burstTPOT95, a.burstTPOT95))
	fmt.Fprintf(&b, "| batch | lines | completed | failed | exactly once | completion time |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range bw.results {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s |\n", r.status, r.total, r.completed, r.failed, r.once, r.took.Round(time.Second))
	}
	all, once := 0, 0
	for _, r := range bw.results {
		all += r.total
		once += r.once
	}
	ended := fmt.Sprintf("All batches ended %s after submission.", bw.finished.Sub(bw.started).Round(time.Second))
	if bw.err != nil {
		ended = fmt.Sprintf("Not every batch had ended when the runner stopped waiting, %s after submission (counts as last read).", bw.finished.Sub(bw.started).Round(time.Second))
	}
	fmt.Fprintf(&b, "\n%s While batch work was pending, the agents' idle slots (not held by interactive work) added up to %s slot-seconds, of which batch jobs held %s: **%.0f%%**. "+
		"(Without batch work, %d cycle(s) left %s slot-seconds idle.) Slots are the agents' heartbeats (`slots`, `active`, `batch_active`) added up every 250 ms.\n\n",
		ended, fmtInt(idleSS), fmtInt(batchSS), share*100, plan.aloneCycles, fmtInt(aloneIdle))
	within := func(x, y time.Duration) bool { return y > 0 && float64(x) <= 1.1*float64(y) }
	fmt.Fprintf(&b, "| goal | wanted | measured | |\n|---|---|---|---|\n")
	goal := func(name, want, got string, met bool) {
		v := "met"
		if !met {
			v = "**missed**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, want, got, v)
	}
	goal("interactive TTFT p95", "<= +10% ("+fmtDur(time.Duration(1.1*float64(a.ttft95)))+")", fmtDur(w.ttft95), within(w.ttft95, a.ttft95))
	goal("interactive TTFT p99", "<= +10% ("+fmtDur(time.Duration(1.1*float64(a.ttft99)))+")", fmtDur(w.ttft99), within(w.ttft99, a.ttft99))
	goal("interactive TPOT p95", "<= +10% ("+fmtDur(time.Duration(1.1*float64(a.tpot95)))+")", fmtDur(w.tpot95), within(w.tpot95, a.tpot95))
	goal("idle capacity used by batch work", ">= 85%", fmt.Sprintf("%.0f%%", share*100), share >= 0.85)
	goal("lines answered exactly once", "100%", fmt.Sprintf("%d of %d", once, all), all > 0 && once == all)
	if bw.err != nil {
		fmt.Fprintf(&b, "\nProblems: %v\n", bw.err)
	}
	out := b.String()
	fmt.Println(out)
	return writeSection(filepath.Join(d.out, "batch.md"), "## Benchmark", out)
}

func (e *env) quickNote() string {
	if e.quick {
		return " with `--quick` (shorter windows, 100 lines per batch)"
	}
	return ""
}

// batchFleet starts the broker and plan.engines batch-model engines, each
// behind its own agent.
func (e *env) batchFleet(plan batchPlan) (*goodputProcs, error) {
	br, err := e.startBroker("broker-batch", "", "--slow-start", "0", "--slo-ttft", goodTTFT.String(), "--slo-itl", batchTPOT.String())
	if err != nil {
		return nil, err
	}
	g := &goodputProcs{e: e, br: br, agents: map[string]*proc{}, engines: map[string]*proc{}, slots: 16}
	var ids []string
	for i := range plan.engines {
		id := fmt.Sprintf("b%d", i+1)
		if err := g.add(id, "regular", batchEngineArgs(), []string{"--slow-start", "0"}); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return g, e.waitEligible(br.HTTP, ids...)
}

// batchGoodput sweeps the interactive workload's rate as the goodput
// scenario does and returns the highest rate sustained and the rates
// tried.
func (e *env) batchGoodput(client *http.Client, base string, rng *rand.Rand, plan batchPlan) (float64, string) {
	res, _ := gridSweep{step: 1.5, window: plan.probeWindow}.run(4, 5, func(rate float64) (goodputPoint, error) {
		samples := e.interactive(client, base, rng, []phase{{rate: rate, d: plan.probeWindow}})
		p := goodputPoint{rate: rate, sent: len(samples)}
		for _, s := range samples {
			if s.failed {
				p.fail++
			} else if s.ttft <= goodTTFT && s.tpot <= batchTPOT {
				p.good++
			}
		}
		return p, e.ctx.Err()
	})
	var tried []string
	for _, p := range res.points {
		tried = append(tried, fmt.Sprintf("%g: %.0f%%", p.rate, 100*p.attainment()))
	}
	return res.goodput, strings.Join(tried, ", ")
}

// warmFleet sends a few requests of the mix, long prompts among them, so
// that the first measured window does not pay for cold connections.
func warmFleet(e *env, client *http.Client, base string, rng *rand.Rand) {
	var wg sync.WaitGroup
	for i := range 16 {
		w := goodputWork(rng, fmt.Sprintf("warm%d", i), i%3 == 0)
		wg.Go(func() { _, _ = goodputRequest(e.ctx, client, base, w) })
	}
	wg.Wait()
}

// phase is a stretch of Poisson arrivals at rate for d; burst marks the
// busy stretches.
type phase struct {
	rate  float64
	d     time.Duration
	burst bool
}

// batchRun runs cycles of plan's interactive load while sampling the
// fleet's slots; with bw it submits bw's batches at the start and adds
// idle stretches until they have ended.
func (e *env) batchRun(client *http.Client, base, natsURL string, rng *rand.Rand, cycles int, plan batchPlan, burstRate, idleRate float64, bw *batchWork) ([]interactiveSample, []slotSample) {
	ctx, stop := context.WithCancel(e.ctx)
	defer stop()
	var slots []slotSample
	var sampleErr error
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		slots, sampleErr = sampleSlots(ctx, natsURL)
	}()
	var phases []phase
	for range cycles {
		phases = append(phases, phase{burstRate, plan.burst, true}, phase{idleRate, plan.idle, false})
	}
	var bwDone chan struct{}
	if bw != nil {
		bwDone = make(chan struct{})
		go func() {
			defer close(bwDone)
			bw.run(ctx)
		}()
	}
	samples := e.interactive(client, base, rng, phases)
	if bw != nil {
		ended := func() bool {
			select {
			case <-bwDone:
				return true
			default:
				return false
			}
		}
		// Idle stretches until the batches end, for at most two more
		// idle stretches' time; then the batches are reported unfinished.
		for extra := 0; extra < 6 && !ended(); extra++ {
			samples = append(samples, e.interactive(client, base, rng, []phase{{idleRate, plan.idle / 3, false}})...)
		}
		stop()
		<-bwDone
	}
	stop()
	<-sampled
	if sampleErr != nil {
		e.logf("batch: no slot samples: %v", sampleErr)
	}
	return samples, slots
}

// interactive sends Poisson arrivals through phases and waits for every
// answer.
func (e *env) interactive(client *http.Client, base string, rng *rand.Rand, phases []phase) []interactiveSample {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []interactiveSample
	i := 0
	for _, ph := range phases {
		end := time.Now().Add(ph.d)
		for time.Now().Before(end) && e.ctx.Err() == nil {
			w := goodputWork(rng, fmt.Sprintf("request%d", i), false)
			i++
			burst := ph.burst
			wg.Go(func() {
				s := interactiveRequest(e.ctx, client, base, w)
				s.burst = burst
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
			})
			select {
			case <-e.ctx.Done():
			case <-time.After(time.Duration(rng.ExpFloat64() / ph.rate * float64(time.Second))):
			}
		}
	}
	wg.Wait()
	return out
}

// interactiveRequest streams one chat request and times its first token
// and the mean time per output token after it.
func interactiveRequest(ctx context.Context, c *http.Client, base string, w goodputReq) interactiveSample {
	s := interactiveSample{sent: time.Now(), failed: true}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, w.prompt, w.maxTokens)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return s
	}
	var first, last time.Time
	tokens := 0
	events := sse.NewReader(resp.Body, maxSSEEvent)
	for {
		ev, err := events.Next()
		if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && string(ev.Data) == "[DONE]") {
			return s
		}
		payload := string(ev.Data)
		switch {
		case payload == "[DONE]":
			if tokens == 0 {
				return s
			}
			s.failed = false
			s.ttft = first.Sub(s.sent)
			if tokens > 1 {
				s.tpot = last.Sub(first) / time.Duration(tokens-1)
			}
			return s
		case strings.HasPrefix(payload, `{"error"`):
			return s
		case strings.Contains(payload, `"content":"`) && !strings.Contains(payload, `"content":""`):
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			last = now
			tokens++
		}
	}
}

type batchStats struct {
	n, failed                      int
	ttft50, ttft95, ttft99, tpot95 time.Duration
	burstTTFT95, burstTPOT95       time.Duration
}

// interactiveStats is the percentiles of the answered requests; a failed
// request counts in failed only.
func interactiveStats(samples []interactiveSample) batchStats {
	st := batchStats{n: len(samples)}
	var ttft, tpot, bttft, btpot []float64
	for _, s := range samples {
		if s.failed {
			st.failed++
			continue
		}
		ttft = append(ttft, float64(s.ttft))
		if s.tpot > 0 {
			tpot = append(tpot, float64(s.tpot))
		}
		if s.burst {
			bttft = append(bttft, float64(s.ttft))
			if s.tpot > 0 {
				btpot = append(btpot, float64(s.tpot))
			}
		}
	}
	for _, v := range [][]float64{ttft, tpot, bttft, btpot} {
		slices.Sort(v)
	}
	p := func(v []float64, q float64) time.Duration { return time.Duration(percentile(v, q)) }
	st.ttft50, st.ttft95, st.ttft99, st.tpot95 = p(ttft, 50), p(ttft, 95), p(ttft, 99), p(tpot, 95)
	st.burstTTFT95, st.burstTPOT95 = p(bttft, 95), p(btpot, 95)
	return st
}

// batchInput is one batch's JSONL: n chat lines with custom_ids
// "b<batch>-<line>".
func batchInput(rng *rand.Rand, batch, n int) []byte {
	var b bytes.Buffer
	vocab := []string{"summarize", "the", "record", "of", "a", "harbour", "survey", "with", "tides", "and", "soundings", "charted"}
	for i := range n {
		words, out := 50+rng.IntN(151), 100+rng.IntN(301)
		var sb strings.Builder
		fmt.Fprintf(&sb, "batch%d line%d", batch, i)
		for w := 2; w < words; w++ {
			sb.WriteByte(' ')
			sb.WriteString(vocab[rng.IntN(len(vocab))])
		}
		line, _ := json.Marshal(map[string]any{
			"custom_id": fmt.Sprintf("b%d-%d", batch, i), "method": "POST", "url": "/v1/chat/completions",
			"body": map[string]any{"model": model, "max_tokens": out, "messages": []map[string]string{{"role": "user", "content": sb.String()}}},
		})
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// batchWork submits batches through the Files and Batches APIs, waits for
// each to end and checks its output and error files.
type batchWork struct {
	e      *env
	client *http.Client
	base   string
	inputs [][]byte

	load0             string
	started, finished time.Time
	results           []batchResult
	// submitErr is an upload or creation that failed; err is a batch that
	// did not complete with every line exactly once.
	submitErr, err error
}

// batchResult is one batch as it ended: its status and counts, how many
// of its custom_ids appear exactly once across its output and error
// files, and how long it took from submission.
type batchResult struct {
	status                   string
	total, completed, failed int
	once                     int
	took                     time.Duration
}

// batchObject is the part of OpenAI's batch object the runner reads.
type batchObject struct {
	ID            string  `json:"id"`
	Status        string  `json:"status"`
	OutputFileID  *string `json:"output_file_id"`
	ErrorFileID   *string `json:"error_file_id"`
	RequestCounts struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
	Errors *struct {
		Data []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"data"`
	} `json:"errors"`
}

func (w *batchWork) run(ctx context.Context) {
	w.load0 = loadavg()
	w.started = time.Now()
	ids := make([]string, len(w.inputs))
	for i, in := range w.inputs {
		id, err := submitBatch(ctx, w.client, w.base, fmt.Sprintf("batch-%d.jsonl", i), in)
		if err != nil {
			w.submitErr = err
			w.finished = time.Now()
			return
		}
		ids[i] = id
	}
	results := make([]batchResult, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			results[i], errs[i] = waitBatch(ctx, w.client, w.base, id, w.inputs[i], w.started)
		})
	}
	wg.Wait()
	w.finished = time.Now()
	w.results = results
	w.err = errors.Join(errs...)
}

// submitBatch uploads input as a batch file and creates a batch of it.
func submitBatch(ctx context.Context, c *http.Client, base, name string, input []byte) (string, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, err := mw.CreateFormFile("file", name)
	if err != nil {
		return "", err
	}
	_, _ = fw.Write(input)
	if err := mw.Close(); err != nil {
		return "", err
	}
	var file struct {
		ID string `json:"id"`
	}
	if err := doJSON(ctx, c, http.MethodPost, base+"/v1/files", mw.FormDataContentType(), &body, &file); err != nil {
		return "", fmt.Errorf("upload %s: %w", name, err)
	}
	req, _ := json.Marshal(map[string]any{"input_file_id": file.ID, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
	var b batchObject
	if err := doJSON(ctx, c, http.MethodPost, base+"/v1/batches", "application/json", bytes.NewReader(req), &b); err != nil {
		return "", fmt.Errorf("create batch of %s: %w", file.ID, err)
	}
	return b.ID, nil
}

// waitBatch polls batch id until it ends, then reads its output and error
// files and counts the custom_ids of input that appear exactly once.
func waitBatch(ctx context.Context, c *http.Client, base, id string, input []byte, started time.Time) (batchResult, error) {
	var b batchObject
	for {
		if err := doJSON(ctx, c, http.MethodGet, base+"/v1/batches/"+id, "", nil, &b); err != nil {
			return batchResult{}, err
		}
		if slices.Contains([]string{"completed", "failed", "expired", "cancelled"}, b.Status) {
			break
		}
		select {
		case <-ctx.Done():
			return batchResult{status: b.Status, total: b.RequestCounts.Total, completed: b.RequestCounts.Completed, failed: b.RequestCounts.Failed},
				fmt.Errorf("batch %s still %s: %w", id, b.Status, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	r := batchResult{status: b.Status, total: b.RequestCounts.Total, completed: b.RequestCounts.Completed, failed: b.RequestCounts.Failed, took: time.Since(started)}
	if b.Status != "completed" {
		msg := ""
		if b.Errors != nil && len(b.Errors.Data) > 0 {
			msg = ": " + b.Errors.Data[0].Code + " " + b.Errors.Data[0].Message
		}
		return r, fmt.Errorf("batch %s ended %s%s", id, b.Status, msg)
	}
	seen := map[string]int{}
	for _, f := range []*string{b.OutputFileID, b.ErrorFileID} {
		if f == nil || *f == "" {
			continue
		}
		if err := countCustomIDs(ctx, c, base, *f, seen); err != nil {
			return r, err
		}
	}
	want := 0
	for line := range bytes.SplitSeq(bytes.TrimSpace(input), []byte("\n")) {
		var l struct {
			CustomID string `json:"custom_id"`
		}
		_ = json.Unmarshal(line, &l)
		want++
		if seen[l.CustomID] == 1 {
			r.once++
		}
	}
	if r.once != want || len(seen) != want {
		return r, fmt.Errorf("batch %s: %d of %d custom_ids exactly once, %d distinct in its files", id, r.once, want, len(seen))
	}
	return r, nil
}

// countCustomIDs reads a result file's lines and counts each custom_id.
func countCustomIDs(ctx context.Context, c *http.Client, base, fileID string, seen map[string]int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/files/"+fileID+"/content", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("GET /v1/files/%s/content: %s: %s", fileID, resp.Status, b)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var l struct {
			CustomID string `json:"custom_id"`
		}
		if err := dec.Decode(&l); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("file %s: %w", fileID, err)
		}
		seen[l.CustomID]++
	}
}

// doJSON sends a request and decodes a 200 answer's JSON into out.
func doJSON(ctx context.Context, c *http.Client, method, url, ctype string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(b))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// sampleSlots listens to the agents' heartbeats on natsURL and every
// 250 ms adds up the last one of each ready agent: its slots, the jobs it
// holds (active) and how many of those are batch jobs (batch_active). It
// returns the samples when ctx ends.
func sampleSlots(ctx context.Context, natsURL string) ([]slotSample, error) {
	nc, err := nats.Connect(natsURL, nats.Name("bench-slot-sampler"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	sb, err := subjects.New(subjects.DefaultPrefix)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	last := map[string]*wire.Heartbeat{}
	sub, err := nc.Subscribe(sb.HeartbeatsAll(), func(m *nats.Msg) {
		hb, err := wire.UnmarshalHeartbeat(m.Data)
		if err != nil {
			return
		}
		mu.Lock()
		last[hb.GetAgentId()] = hb
		mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	var out []slotSample
	for {
		select {
		case <-ctx.Done():
			return out, nil
		case <-time.After(250 * time.Millisecond):
		}
		s := slotSample{at: time.Now()}
		mu.Lock()
		for _, hb := range last {
			if hb.GetState() != wire.StateReady {
				continue
			}
			s.slots += int(hb.GetSlots())
			s.batch += int(hb.GetBatchActive())
			s.interactive += max(0, int(hb.GetActive())-int(hb.GetBatchActive()))
		}
		mu.Unlock()
		out = append(out, s)
	}
}

// idleShare sums, over the samples between from and to (all of them when
// both are zero), the slot-seconds interactive work left idle and those
// batch work held, and returns the share.
func idleShare(samples []slotSample, from, to time.Time) (share, idle, batch float64) {
	for i := 1; i < len(samples); i++ {
		s, prev := samples[i], samples[i-1]
		if !from.IsZero() && (s.at.Before(from) || s.at.After(to)) {
			continue
		}
		dt := s.at.Sub(prev.at).Seconds()
		idle += float64(max(0, s.slots-s.interactive)) * dt
		batch += float64(s.batch) * dt
	}
	if idle > 0 {
		share = batch / idle
	}
	return share, idle, batch
}

// writeSection replaces the section of the markdown file at path that
// starts with heading, up to the next second-level heading, with body, or
// appends body when the file has no such section.
func writeSection(path, heading, body string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	s := string(old)
	body = strings.TrimRight(body, "\n") + "\n"
	start := -1
	if strings.HasPrefix(s, heading+"\n") {
		start = 0
	} else if i := strings.Index(s, "\n"+heading+"\n"); i >= 0 {
		start = i + 1
	}
	if start < 0 {
		if s != "" {
			s = strings.TrimRight(s, "\n") + "\n\n"
		}
		return os.WriteFile(path, []byte(s+body), 0o644)
	}
	after, tail := s[start+len(heading):], ""
	if j := strings.Index(after, "\n## "); j >= 0 {
		tail = "\n" + after[j+1:]
	}
	return os.WriteFile(path, []byte(s[:start]+body+tail), 0o644)
}
