package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
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

func (f goodputFleet) String() string {
	if f.prefill == 0 && f.decode == 0 {
		return fmt.Sprintf("%d regular", f.regular)
	}
	return fmt.Sprintf("%d+%dP+%dD", f.regular, f.prefill, f.decode)
}

// goodput measures, per rollout step and dispatch mode, the highest
// Poisson arrival rate at which at least 90% of requests meet TTFT <= 2s
// and TPOT <= 20ms, on fleets of batch-model sim-engines (each behind its
// own worker-agent) under a mixed workload: 70% chat, 30% long documents.
func (e *env) goodput(d *doc) error {
	fleets := []goodputFleet{{8, 0, 0}, {6, 1, 1}, {4, 2, 2}, {2, 3, 3}, {0, 4, 4}}
	modes := []string{"count", "capacity", "threshold", "slo"}
	rates := []float64{1, 2, 4, 6, 8, 12, 16}
	window := 30 * time.Second
	if e.quick {
		rates = []float64{1, 4}
		window = 6 * time.Second
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Goodput by dispatch mode through a rollout to PD\n\n")
	fmt.Fprintf(&b, "Fleets of `sim-engine --batch-model` processes (defaults of the batch model; 16 slots), each behind its own worker-agent (16 slots), "+
		"prefill and decode over the vLLM hand-off. Workload: 70%% chat (20-300 words in, 50-250 tokens out), 30%% long documents (4,000-12,000 words in, 100-200 tokens out), "+
		"Poisson arrivals for %s per rate. Goodput is the highest rate (requests/s) at which at least %.0f%% of requests met TTFT <= %s and TPOT <= %s "+
		"(the broker runs with `--slo-ttft %s --slo-itl %s`, the targets `slo` predicts for); 0 when none was. Rates tried: %v.\n\n",
		window, goodFraction*100, goodTTFT, goodTPOT, goodTTFT, goodTPOT, rates)
	fmt.Fprintf(&b, "| fleet | %s |\n|---|%s\n", strings.Join(modes, " | "), strings.Repeat("---|", len(modes)))
	for _, f := range fleets {
		row := []string{f.String()}
		for _, mode := range modes {
			if f.prefill == 0 && mode != modes[0] {
				row = append(row, "(as count)") // one route: every mode is the same
				continue
			}
			e.logf("goodput: %s, mode %s", f, mode)
			g, err := e.goodputRun(f, mode, rates, window)
			if err != nil {
				return fmt.Errorf("%s %s: %w", f, mode, err)
			}
			row = append(row, g)
			e.sup.stopAll()
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Println(b.String())
	d.add(b.String())
	return nil
}

// goodputRun starts fleet f under mode, sweeps rates up until one misses
// the targets, and returns the goodput with each rate's attainment.
func (e *env) goodputRun(f goodputFleet, mode string, rates []float64, window time.Duration) (string, error) {
	const slots = 16
	br, err := e.startBroker("broker-goodput-"+mode, "", "--dispatch-mode", mode,
		"--slo-ttft", goodTTFT.String(), "--slo-itl", goodTPOT.String(), "--slow-start", "0")
	if err != nil {
		return "", err
	}
	var ids []string
	add := func(id, role string) error {
		p, err := e.sup.start("goodput-engine-"+id, e.path("sim-engine"), "--listen", "127.0.0.1:0", "--model", model, "--batch-model",
			"--slots", strconv.Itoa(slots), "--role", role, "--pd-protocol", "vllm", "--bootstrap-port", "0", "--log-level", "info")
		if err != nil {
			return err
		}
		m, err := p.waitFor(e.ctx, engineAddr, 20*time.Second)
		if err != nil {
			return err
		}
		args := []string{"--engine-url", "http://" + m[1], "--slots", strconv.Itoa(slots), "--slow-start", "0"}
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
		if _, err := e.startAgent(id, br.NATS, "", args...); err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	}
	for i := range f.regular {
		if err := add(fmt.Sprintf("r%d", i+1), "regular"); err != nil {
			return "", err
		}
	}
	for i := range f.prefill {
		if err := add(fmt.Sprintf("p%d", i+1), "prefill"); err != nil {
			return "", err
		}
	}
	for i := range f.decode {
		if err := add(fmt.Sprintf("d%d", i+1), "decode"); err != nil {
			return "", err
		}
	}
	if err := e.waitEligible(br.HTTP, ids...); err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, DisableCompression: true}}
	defer client.CloseIdleConnections()
	// The broker learns every route's latency from a few requests first.
	rng := rand.New(rand.NewPCG(uint64(len(ids)), uint64(len(mode))))
	var warm sync.WaitGroup
	for i := range 16 {
		w := goodputWork(rng, -1-i, i%3 == 0)
		warm.Go(func() { goodputRequest(e.ctx, client, br.HTTP, w) })
	}
	warm.Wait()

	best := 0.0
	var tried []string
	for _, rate := range rates {
		good, n := e.goodputRate(client, br.HTTP, rng, rate, window)
		frac := 0.0
		if n > 0 {
			frac = float64(good) / float64(n)
		}
		tried = append(tried, fmt.Sprintf("%g: %.0f%%", rate, frac*100))
		if frac < goodFraction {
			break
		}
		best = rate
	}
	return fmt.Sprintf("**%g** (%s)", best, strings.Join(tried, ", ")), nil
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

// goodputRate sends Poisson arrivals at rate for window and returns how
// many requests met the targets, of how many were sent.
func (e *env) goodputRate(client *http.Client, base string, rng *rand.Rand, rate float64, window time.Duration) (good, n int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(window)
	for i := 0; time.Now().Before(end) && e.ctx.Err() == nil; i++ {
		w := goodputWork(rng, i, rng.Float64() < 0.3)
		n++
		wg.Go(func() {
			ok := goodputRequest(e.ctx, client, base, w)
			mu.Lock()
			if ok {
				good++
			}
			mu.Unlock()
		})
		select {
		case <-e.ctx.Done():
		case <-time.After(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))):
		}
	}
	wg.Wait()
	return good, n
}

// goodputRequest streams one request and reports whether it met the
// targets: TTFT <= goodTTFT and mean time per output token after the
// first <= goodTPOT.
func goodputRequest(ctx context.Context, c *http.Client, base string, w goodputReq) bool {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, w.prompt, w.maxTokens)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return false
	}
	var first, last time.Time
	tokens := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		payload, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case payload == "[DONE]":
			if tokens == 0 || first.Sub(sent) > goodTTFT {
				return false
			}
			return tokens < 2 || last.Sub(first)/time.Duration(tokens-1) <= goodTPOT
		case strings.HasPrefix(payload, `{"error"`):
			return false
		case strings.Contains(payload, `"content":"`) && !strings.Contains(payload, `"content":""`):
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			last = now
			tokens++
		}
	}
	return false
}
