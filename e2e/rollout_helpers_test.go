package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/simengine"
)

// ---- engines with a spy ----

// engineHit is one POST an engine received: which request (its tag in
// the prompt) and when.
type engineHit struct {
	tag int
	at  time.Time
}

// rolloutEngine is a sim-engine on a loopback port whose handler records, per
// request tag, every POST it receives, so the test can tell whether a
// prefill ran twice or a job ran for a client that had gone. Hooks let the
// scenario see a prefill end (onDone) and hold a decode leg before it
// reaches the engine (hold), as a real decode engine's queue would.
type rolloutEngine struct {
	*simengine.Engine
	name string
	URL  string

	mu   sync.Mutex
	hits []engineHit

	onDone func(tag int)               // after the engine answered a POST
	hold   func(tag int) time.Duration // wait before passing a POST on
	stop   func()
}

var tagRE = regexp.MustCompile(`rq-(\d+)`)

// rolloutHooks are set before the engine serves, so its handlers read
// them without a lock.
type rolloutHooks struct {
	onDone func(tag int)
	hold   func(tag int) time.Duration
}

func startRolloutEngine(t testing.TB, name string, cfg simengine.Config, hooks ...rolloutHooks) *rolloutEngine {
	t.Helper()
	se, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &rolloutEngine{Engine: se, name: name}
	for _, h := range hooks {
		e.onDone, e.hold = h.onDone, h.hold
	}
	h := se.Handler()
	spy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		tag := -1
		if m := tagRE.FindSubmatch(body); m != nil {
			tag, _ = strconv.Atoi(string(m[1]))
		}
		if tag >= 0 && e.hold != nil {
			if d := e.hold(tag); d > 0 {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					// The caller gave up before the engine saw the request.
					return
				}
			}
		}
		if tag >= 0 {
			e.mu.Lock()
			e.hits = append(e.hits, engineHit{tag: tag, at: time.Now()})
			e.mu.Unlock()
		}
		h.ServeHTTP(w, r)
		if tag >= 0 && e.onDone != nil {
			e.onDone(tag)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: spy}
	go func() { _ = srv.Serve(ln) }()
	e.stop = func() { _ = srv.Close(); _ = se.Close() }
	t.Cleanup(e.stop)
	e.URL = "http://" + ln.Addr().String()
	return e
}

func (e *rolloutEngine) Hits() []engineHit {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.hits)
}

// heldKVMetric is the sim-engine's gauge of KV blocks a prefill holds for
// a decode that has not read them yet.
var heldKVMetric = regexp.MustCompile(`(?m)^switchyard_sim_pd_kv_held_blocks(?:\{[^}]*\})? (\S+)$`)

// heldKV scrapes the engine's /metrics for its held KV blocks.
func (e *rolloutEngine) heldKV() (float64, error) {
	resp, err := http.Get(e.URL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	m := heldKVMetric.FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("%s: no held KV blocks gauge in /metrics", e.name)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// ---- clients ----

// rolloutReq is one request of the scenario as its client saw it.
type rolloutReq struct {
	tag       int
	kind      string // steady, long or handoff
	sent, end time.Time
	ttft      time.Duration // 0: no token arrived
	route     string
	err       string
	cancelled bool // the client hung up on purpose during the hand-off
}

func (r *rolloutReq) failed() bool { return r.err != "" && !r.cancelled }

// rolloutStream sends one streaming chat request and reads it to the end
// (or until ctx ends it), recording time to the first content token.
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
		r.err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		return
	}
	br := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := br.ReadString('\n')
		payload, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		switch {
		case !ok:
		case payload == "[DONE]":
			done = true
		case strings.HasPrefix(payload, `{"error"`):
			r.err = "error event: " + payload
		case r.ttft == 0 && strings.Contains(payload, `"content":"`) && !strings.Contains(payload, `"content":""`):
			r.ttft = time.Since(r.sent)
		}
		if err != nil {
			if r.err == "" && !done {
				r.err = fmt.Sprintf("stream ended without [DONE]: %v", err)
			}
			return
		}
	}
}

func rolloutHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true}}
}

// poisson calls fire at the arrivals of a Poisson process of rate per
// second (seeded, so the sequence of gaps repeats) until ctx ends.
func poisson(ctx context.Context, seed uint64, rate func() float64, fire func()) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	next := time.Now()
	for {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate() * float64(time.Second)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		fire()
	}
}

// ---- the dispatcher's view ----

type fleetAgentSample struct {
	ID             string  `json:"id"`
	Pool           string  `json:"pool"`
	State          string  `json:"state"`
	Slots          int     `json:"slots"`
	Active         int     `json:"active"`
	EffectiveSlots float64 `json:"effective_slots"`
	Eligible       bool    `json:"eligible"`
	Reason         string  `json:"reason"`
}

type fleetSample struct {
	at     time.Time
	share  map[string]float64
	agents []fleetAgentSample
}

func sampleFleet(base string) (fleetSample, error) {
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		return fleetSample{}, err
	}
	defer resp.Body.Close()
	var f struct {
		Models []struct {
			Share map[string]float64 `json:"share"`
		} `json:"models"`
		Agents []fleetAgentSample `json:"agents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		return fleetSample{}, err
	}
	s := fleetSample{at: time.Now(), agents: f.Agents}
	if len(f.Models) > 0 {
		s.share = f.Models[0].Share
	}
	return s, nil
}

// poolUtil is a pool's active over effective slots in one sample, counting
// the agents that serve (ready); ok is false when the pool has none.
func (s fleetSample) poolUtil(pool string) (u float64, ok bool) {
	var active, eff float64
	for _, a := range s.agents {
		if a.Pool == pool && a.State == "ready" && a.Eligible {
			active += float64(a.Active)
			eff += a.EffectiveSlots
		}
	}
	if eff == 0 {
		return 0, false
	}
	return active / eff, true
}

// ---- statistics ----

// quantile of ds (sorted in place) by the nearest-rank method.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// ---- windows ----

// rolloutPhase is a window of the scenario: from at to the next phase's.
type rolloutPhase struct {
	name string
	at   time.Time
}

// samplesIn returns the fleet samples taken in phase i.
func samplesIn(samples []fleetSample, phases []rolloutPhase, i int) []fleetSample {
	var out []fleetSample
	for _, s := range samples {
		if !s.at.Before(phases[i].at) && s.at.Before(phases[i+1].at) {
			out = append(out, s)
		}
	}
	return out
}

// rolloutTable renders the per-window table of docs/dispatch.md: route
// shares of the requests sent in the window, mean utilisation of the
// serving agents per pool, TTFT of the steady requests, failures.
func rolloutTable(phases []rolloutPhase, reqs []*rolloutReq, samples []fleetSample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| window | duration | requests | regular | PD | util regular | util decode | TTFT p50 | TTFT p99 | failed | cancelled |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i := 0; i+1 < len(phases); i++ {
		from, to := phases[i].at, phases[i+1].at
		n, reg, pd, failed, cancelled := 0, 0, 0, 0, 0
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
			if r.failed() {
				failed++
			}
			if r.cancelled {
				cancelled++
			}
			if r.kind == "steady" && r.ttft > 0 {
				ttft = append(ttft, r.ttft)
			}
		}
		util := func(pool string) string {
			sum, k := 0.0, 0
			for _, s := range samplesIn(samples, phases, i) {
				if u, ok := s.poolUtil(pool); ok {
					sum, k = sum+u, k+1
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
		ms := func(d time.Duration) string {
			if len(ttft) == 0 {
				return "–"
			}
			return fmt.Sprintf("%d ms", d.Milliseconds())
		}
		fmt.Fprintf(&b, "| %s | %.1f s | %d | %s | %s | %s | %s | %s | %s | %d | %d |\n", phases[i].name, to.Sub(from).Seconds(), n,
			share(reg), share(pd), util("regular"), util("decode"), ms(quantile(ttft, 0.5)), ms(quantile(ttft, 0.99)), failed, cancelled)
	}
	return b.String()
}

func getBody(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// probe is a client that hangs up when its prefill ends; a prefill run
// twice must not close its channel twice.
type probe struct {
	ended chan struct{}
	once  sync.Once
}

func (p *probe) hangUp() { p.once.Do(func() { close(p.ended) }) }
