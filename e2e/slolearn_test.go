package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// The batch model of the learning tests: 6ms a step, 80µs per running
// sequence and 50µs per prefilled token, so the engine's true prefill rate
// is 20,000 tokens a second.
const (
	learnPerToken = 50 * time.Microsecond
	learnTrueRate = float64(time.Second / learnPerToken)
)

func learnEngine(slots int) simengine.Config {
	return simengine.Config{Model: model, Slots: slots, PrefixCacheBlocks: 1 << 16,
		Batch: simengine.BatchModel{
			Enabled: true, MaxBatchedTokens: 8192,
			StepTime: 6 * time.Millisecond, StepPerSeq: 80 * time.Microsecond, StepPerPrefillToken: learnPerToken,
		}}
}

type fleetLearned struct {
	Models []struct {
		SLOGuard string `json:"slo_guard"`
		Pools    []struct {
			Pool    string `json:"pool"`
			Learned *struct {
				Samples         int     `json:"samples"`
				Rate            float64 `json:"prefill_tokens_per_second"`
				Unreported      int     `json:"cache_unreported_agents"`
				PrefillLearning string  `json:"prefill_learning"`
			} `json:"learned"`
			Predictions *struct {
				Samples        int     `json:"samples"`
				MedianError    float64 `json:"median_relative_error"`
				ITLSamples     int     `json:"itl_samples"`
				ITLMedianError float64 `json:"itl_median_relative_error"`
				Off            bool    `json:"off"`
			} `json:"predictions"`
		} `json:"pools"`
	} `json:"models"`
}

func learnFleet(t *testing.T, base string) fleetLearned {
	t.Helper()
	var f fleetLearned
	if err := json.Unmarshal([]byte(sloGet(t, base+"/v1/fleet")), &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Models) != 1 {
		t.Fatalf("%d models in the fleet view", len(f.Models))
	}
	return f
}

// postTargeted sends a chat completion with a TTFT target (0: none) and returns
// its route.
func postTargeted(ctx context.Context, base, prompt string, maxTokens int, ttft time.Duration) (string, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, model, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	if ttft > 0 {
		req.Header.Set("x-slo-ttft-ms", fmt.Sprint(ttft.Milliseconds()))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	text := readAll(resp)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, text)
	}
	return resp.Header.Get("X-Switchyard-Route"), nil
}

// TestSLOLearnedRate: the prefill rate the broker learns of a regular
// engine stays within 25% of the engine's true rate whatever the agent's
// slots, with the agent full (every slot prefilling long prompts in the
// same engine steps, or, with more agent slots than engine slots, queued
// inside the engine) and half the prompts repeated, which the engine
// serves from its prefix cache: the broker counts the tokens the engine
// reports it prefilled, over the agent's busy time.
func TestSLOLearnedRate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs timed engine steps")
	}
	for _, tc := range []struct{ slots, engineSlots int }{{8, 8}, {32, 32}, {64, 64}, {32, 8}} {
		slots := tc.slots
		t.Run(fmt.Sprintf("%d slots, engine %d", slots, tc.engineSlots), func(t *testing.T) {
			b := cmdtest.StartBroker(t, "--dispatch-mode", "slo")
			startAgent(t, b.NATS, "r1", startEngine(t, learnEngine(tc.engineSlots)), slots)
			cmdtest.WaitEligible(t, b.HTTP, "r1")
			ctx := context.Background()
			// Rounds of slots concurrent requests of 1,500 words or more,
			// at least a second of prefill a round, so that what is not
			// the engine's (the hops between broker, agent and engine)
			// stays a small part of the busy time; from the second round
			// on, half of them repeat a prompt of the round before.
			words := max(1500, 24000/slots)
			for round := range 3 {
				var wg sync.WaitGroup
				errs := make(chan error, slots)
				for i := range slots {
					id := round*slots + i
					if round > 0 && i%2 == 0 {
						id = (round-1)*slots + i
					}
					wg.Go(func() {
						if _, err := postTargeted(ctx, b.HTTP, sloPrompt("learn", id, words), 2, 0); err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
			}
			f := learnFleet(t, b.HTTP)
			for _, p := range f.Models[0].Pools {
				if p.Pool != "regular" {
					continue
				}
				if p.Learned == nil || p.Learned.PrefillLearning != "engine-reported" {
					t.Fatalf("regular pool learned %+v, want a rate from engine-reported tokens", p.Learned)
				}
				got := p.Learned.Rate
				t.Logf("%d slots, engine %d: learned %.0f tokens/s, true %.0f", slots, tc.engineSlots, got, learnTrueRate)
				if got < 0.75*learnTrueRate || got > 1.25*learnTrueRate {
					t.Errorf("%d slots: learned prefill rate %.0f tokens/s, want within 25%% of the engine's %.0f", slots, got, learnTrueRate)
				}
				return
			}
			t.Fatal("no regular pool in the fleet view")
		})
	}
}

// TestSLOUnreportedByCapacity: an engine whose usage reports no cached
// prompt tokens (no prefix cache here, as vLLM without
// --enable-prompt-tokens-details) teaches no prefill rate: the fleet view
// says so and slo decides by capacity, counted by its reason.
func TestSLOUnreportedByCapacity(t *testing.T) {
	b := cmdtest.StartBroker(t, "--dispatch-mode", "slo")
	cfg := learnEngine(4)
	cfg.PrefixCacheBlocks = 0
	startAgent(t, b.NATS, "r1", startEngine(t, cfg), 4)
	cmdtest.WaitEligible(t, b.HTTP, "r1")
	ctx := context.Background()
	i := 0
	testwait.For(t, 60*time.Second, 50*time.Millisecond, func() error {
		i++
		if _, err := postTargeted(ctx, b.HTTP, sloPrompt("plain", i, 200), 2, 2*time.Second); err != nil {
			return err
		}
		if m := sloGet(t, b.HTTP+"/metrics"); !strings.Contains(m, `switchyard_slo_fallback_total{model="`+model+`",reason="unreported"}`) {
			return fmt.Errorf("after %d requests no fallback counted as unreported in /metrics", i)
		}
		return nil
	})
	f := learnFleet(t, b.HTTP)
	for _, p := range f.Models[0].Pools {
		if p.Pool == "regular" && (p.Learned == nil || p.Learned.Rate != 0 || p.Learned.Unreported != 1 ||
			p.Learned.PrefillLearning != "unreported: decided by capacity") {
			t.Fatalf("regular pool learned %+v, want no rate and its agent unreported", p.Learned)
		}
	}
}

// TestSLOGuard: an engine whose first byte comes fast for two requests and
// 600ms late for the third, so that no learned average predicts it, puts
// slo's predictions off by far more than the guard's bound: the broker
// decides by capacity, says so in the fleet view, and counts it.
func TestSLOGuard(t *testing.T) {
	if testing.Short() {
		t.Skip("runs delayed requests")
	}
	b := cmdtest.StartBroker(t, "--dispatch-mode", "slo")
	e := startEngine(t, learnEngine(4))
	target, err := url.Parse(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0) // the test's end cuts streams
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && n.Add(1)%3 == 0 {
			select {
			case <-time.After(600 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	startAgent(t, b.NATS, "r1", &engine{URL: "http://" + ln.Addr().String()}, 4)
	cmdtest.WaitEligible(t, b.HTTP, "r1")
	ctx := context.Background()
	i := 0
	testwait.For(t, 120*time.Second, 0, func() error {
		i++
		if _, err := postTargeted(ctx, b.HTTP, sloPrompt("guard", i, 300), 2, 5*time.Second); err != nil {
			return err
		}
		if g := learnFleet(t, b.HTTP).Models[0].SLOGuard; g == "" {
			return fmt.Errorf("after %d requests the guard does not hold", i)
		}
		return nil
	})
	f := learnFleet(t, b.HTTP)
	for _, p := range f.Models[0].Pools {
		if p.Pool == "regular" && (p.Predictions == nil || !p.Predictions.Off || p.Predictions.MedianError <= 0.5) {
			t.Fatalf("regular predictions %+v, want off by a median error over 0.5", p.Predictions)
		}
	}
	if _, err := postTargeted(ctx, b.HTTP, sloPrompt("guard", 0, 300), 2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	m := sloGet(t, b.HTTP+"/metrics")
	for _, want := range []string{
		`switchyard_slo_fallback_total{model="` + model + `",reason="predictions_off"}`,
		`switchyard_slo_ttft_prediction_error_ratio_count{model="` + model + `",route="regular"}`,
		`switchyard_slo_predicted_ttft_seconds_count{model="` + model + `",route="regular"}`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("no %s in /metrics", want)
		}
	}
}

// slowTokensWriter delays every write after the first: an engine whose
// tokens come late while its first comes on time.
type slowTokensWriter struct {
	http.ResponseWriter
	delay  time.Duration
	writes int
}

func (w *slowTokensWriter) Write(b []byte) (int, error) {
	if w.writes++; w.writes > 1 {
		time.Sleep(w.delay)
	}
	return w.ResponseWriter.Write(b)
}

func (w *slowTokensWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// TestSLOGuardITL: an engine that streams requests' tokens in turn at its
// own pace, 20ms apart and 80ms apart, so that no learned figure
// predicts a request's time per output token, puts slo's ITL predictions
// off beyond the guard's bound: the fleet view scores them apart from the
// TTFT ones, the broker decides by capacity, and /metrics has them.
func TestSLOGuardITL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs delayed requests")
	}
	b := cmdtest.StartBroker(t, "--dispatch-mode", "slo")
	e := startEngine(t, learnEngine(4))
	target, err := url.Parse(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0) // the test's end cuts streams
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			// Three paces, each four times the one before: no one
			// prediction is within half of more than one of them, so
			// the median error is over 0.5 whatever is learned.
			if d := [3]time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond}[n.Add(1)%3]; d > 0 {
				w = &slowTokensWriter{ResponseWriter: w, delay: d}
			}
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	startAgent(t, b.NATS, "r1", &engine{URL: "http://" + ln.Addr().String()}, 4)
	cmdtest.WaitEligible(t, b.HTTP, "r1")
	ctx := context.Background()
	i := 0
	testwait.For(t, 120*time.Second, 0, func() error {
		i++
		if _, err := postTargeted(ctx, b.HTTP, sloPrompt("itlguard", i, 300), 12, 5*time.Second); err != nil {
			return err
		}
		f := learnFleet(t, b.HTTP)
		for _, p := range f.Models[0].Pools {
			if p.Pool == "regular" && p.Predictions != nil && p.Predictions.ITLSamples >= 8 && p.Predictions.ITLMedianError > 0.5 {
				if f.Models[0].SLOGuard == "" || !p.Predictions.Off {
					return fmt.Errorf("after %d requests ITL predictions are off (%+v) but the guard does not hold", i, p.Predictions)
				}
				return nil
			}
		}
		for _, p := range f.Models[0].Pools {
			if p.Pool == "regular" && p.Predictions != nil {
				return fmt.Errorf("after %d requests the regular pool's ITL predictions are not off: %+v", i, *p.Predictions)
			}
		}
		return fmt.Errorf("after %d requests the regular pool has no predictions", i)
	})
	if _, err := postTargeted(ctx, b.HTTP, sloPrompt("itlguard", 0, 300), 12, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	m := sloGet(t, b.HTTP+"/metrics")
	for _, want := range []string{
		`switchyard_slo_fallback_total{model="` + model + `",reason="predictions_off"}`,
		`switchyard_slo_itl_prediction_error_ratio_count{model="` + model + `",route="regular"}`,
		`switchyard_slo_predicted_itl_seconds_count{model="` + model + `",route="regular"}`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("no %s in /metrics", want)
		}
	}
}

// TestSLONoHerding: on a fleet of a regular agent and a PD pair whose
// figures are learned, a burst of short prompts with TTFT and ITL targets
// that regular meets with room to spare does not all go PD: slo prefers
// the cheaper route while it keeps its margin, and what it just sent a
// route counts in that route's prediction at once.
func TestSLONoHerding(t *testing.T) {
	if testing.Short() {
		t.Skip("runs timed engine steps")
	}
	b := cmdtest.StartBroker(t, "--dispatch-mode", "slo")
	learnedPDFleet(t, b)
	ctx := context.Background()
	const burst = 24
	routes := make([]string, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			r, err := sloStream(ctx, b.HTTP, sloPrompt("burst", i, 200), 8, 100*time.Millisecond, nil)
			if err != nil {
				t.Errorf("burst %d: %v", i, err)
			}
			routes[i] = r.route
		})
	}
	wg.Wait()
	onPD := 0
	for _, r := range routes {
		if r == "pd" {
			onPD++
		}
	}
	t.Logf("%d of %d short prompts with targets went to PD", onPD, burst)
	if onPD > burst*3/4 {
		t.Errorf("%d of %d short prompts with targets went to PD: the burst herded", onPD, burst)
	}
}

// learnedPDFleet starts a regular agent (16 slots) and a vLLM PD pair (32
// slots each) on b, then sends short prompts until the broker has learned
// every pool's figures.
func learnedPDFleet(t *testing.T, b *cmdtest.Broker) {
	t.Helper()
	startAgent(t, b.NATS, "r1", startEngine(t, learnEngine(16)), 16)
	pd := func(role simengine.Role) simengine.Config {
		c := learnEngine(32)
		c.Role, c.PDProtocol, c.BootstrapTimeout = role, simengine.PDVLLM, 5*time.Second
		return c
	}
	p := startEngine(t, pd(simengine.RolePrefill))
	d := startEngine(t, pd(simengine.RoleDecode))
	startAgent(t, b.NATS, "pre", p, 32, "--engine", "vllm", "--role", "prefill",
		"--bootstrap-host", "127.0.0.1", "--bootstrap-port", fmt.Sprint(p.BootstrapPort()))
	startAgent(t, b.NATS, "dec", d, 32, "--engine", "vllm", "--role", "decode")
	cmdtest.WaitEligible(t, b.HTTP, "r1", "pre", "dec")
	warm := 0
	testwait.For(t, 60*time.Second, 10*time.Millisecond, func() error {
		var wg sync.WaitGroup
		for range 4 {
			warm++
			prompt := sloPrompt("warm", warm, 200)
			wg.Go(func() { _, _ = sloStream(context.Background(), b.HTTP, prompt, 8, 0, nil) })
		}
		wg.Wait()
		return sloLearned(b.HTTP)
	})
}
