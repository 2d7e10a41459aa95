package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// The SLO scenario's sizes. A long prompt's prefill is one engine step of
// about sloLongWords x the per-token cost (hundreds of milliseconds), which
// every stream decoding beside it on a regular engine waits through; a PD
// route prefills it on the prefill engine, beside no stream. The target
// sits well above a step (tens of milliseconds) and well below such a
// stall, so a loaded machine's pauses do not decide the count.
const (
	sloITLTarget   = 250 * time.Millisecond
	sloShort       = 16   // short streams running when the burst comes
	sloShortTokens = 80   // their length at least: running through the burst
	sloLongs       = 10   // long prompts in the burst
	sloLongWords   = 3000 // their length
)

func sloBatchEngine(role simengine.Role) simengine.Config {
	// The prefix cache makes the engine report its cached prompt tokens,
	// as vLLM does with --enable-prompt-tokens-details: what the broker
	// learns prefill rates from.
	return simengine.Config{Model: model, Slots: 32, Role: role, PDProtocol: simengine.PDVLLM, BootstrapTimeout: 5 * time.Second,
		PrefixCacheBlocks: 4096,
		Batch: simengine.BatchModel{
			Enabled: true, MaxBatchedTokens: 8192,
			StepTime: 15 * time.Millisecond, StepPerSeq: 50 * time.Microsecond,
			StepPerPrefillToken: 100 * time.Microsecond, KVTransferPerToken: time.Microsecond,
		}}
}

// TestSLODispatch runs a mixed fleet (two regular agents, one prefill and
// one decode) of batch-model engines. Short streams run; then a burst of
// long prompts with an inter-token latency target arrives. Under
// --dispatch-mode slo the broker, having learned the pools' latency and
// answer lengths, predicts that a long prefill on the busy regular pool
// would add its whole prefill time to the running streams' (a 12-token
// answer's time per token grows by a twelfth of it) while the decode
// pool runs no prefill, and sends the burst to PD: the short streams on
// regular keep their pace. Under capacity the burst is spread
// by free slots, and most short streams on regular stall.
func TestSLODispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs streams of timed engine steps")
	}
	frac := map[string]float64{}
	for _, mode := range []string{"slo", "capacity"} {
		t.Run(mode, func(t *testing.T) {
			stalled, regular, longsPD := sloBurst(t, mode)
			frac[mode] = float64(stalled) / float64(regular)
			t.Logf("%s: %d of %d short streams on regular had a gap over %s; %d of %d long prompts went to PD", mode, stalled, regular, sloITLTarget, longsPD, sloLongs)
			switch mode {
			case "slo":
				if frac[mode] > 0.35 {
					t.Errorf("slo: %d of %d short streams on regular stalled past the %s target", stalled, regular, sloITLTarget)
				}
				if longsPD < sloLongs*7/10 {
					t.Errorf("slo: only %d of %d long prompts with an ITL target went to PD", longsPD, sloLongs)
				}
			case "capacity":
				if frac[mode] < 0.6 {
					t.Errorf("capacity: only %d of %d short streams on regular stalled: the scenario does not load regular", stalled, regular)
				}
			}
		})
	}
	if s, c := frac["slo"], frac["capacity"]; s > c-0.3 {
		t.Errorf("slo stalled %.2f of the short streams on regular, capacity %.2f: slo must keep far more of them on pace", s, c)
	}
}

// sloBurst runs the scenario under mode and returns how many short
// streams on the regular route had a gap between tokens over the target,
// how many short streams were on regular, and how many long prompts went
// to PD.
func sloBurst(t *testing.T, mode string) (stalled, regular, longsPD int) {
	b := cmdtest.StartBroker(t, "--dispatch-mode", mode)
	for _, id := range []string{"r1", "r2"} {
		startAgent(t, b.NATS, id, startEngine(t, sloBatchEngine(simengine.RoleRegular)), 16)
	}
	p := startEngine(t, sloBatchEngine(simengine.RolePrefill))
	d := startEngine(t, sloBatchEngine(simengine.RoleDecode))
	// The PD pair has room for the whole burst beside the short streams
	// that capacity weighting sends it: slo never chooses a full route, so
	// a pair the short streams fill would push long prompts to regular.
	startAgent(t, b.NATS, "pre", p, 32, "--engine", "vllm", "--role", "prefill",
		"--bootstrap-host", "127.0.0.1", "--bootstrap-port", fmt.Sprint(p.BootstrapPort()))
	startAgent(t, b.NATS, "dec", d, 32, "--engine", "vllm", "--role", "decode")
	cmdtest.WaitEligible(t, b.HTTP, "r1", "r2", "pre", "dec")

	// A target that is not a positive number of milliseconds is refused,
	// naming its header.
	req, err := http.NewRequest(http.MethodPost, b.HTTP+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}]}`, model)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-slo-ttft-ms", "-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if text := readAll(resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(text, `"param":"x-slo-ttft-ms"`) {
		t.Fatalf("bad x-slo-ttft-ms: status %d, body %s", resp.StatusCode, text)
	}
	resp.Body.Close()

	// The broker learns every pool's latency from the chunks it relays:
	// short requests (no targets, weighed by capacity) until the fleet
	// view shows figures for regular, prefill and decode.
	ctx := context.Background()
	warm := 0
	testwait.For(t, 60*time.Second, 10*time.Millisecond, func() error {
		var wg sync.WaitGroup
		for range 4 {
			warm++
			prompt := sloPrompt("warm", warm, 40)
			wg.Go(func() { _, _ = sloStream(ctx, b.HTTP, prompt, 12, 0, nil) })
		}
		wg.Wait()
		return sloLearned(b.HTTP)
	})

	type short struct {
		route    string
		maxGap   time.Duration
		firstErr error
	}
	// The simulator ends sequences early (finish_reason "stop"): the short
	// streams' prompts are ones it answers at length, so that every one is
	// still running when the burst comes.
	var prompts []string
	for seed := 0; len(prompts) < sloShort; seed++ {
		if seed > 100*sloShort {
			t.Fatalf("only %d prompts the simulator answers with %d tokens or more", len(prompts), sloShortTokens)
		}
		p := sloPrompt("short", seed, 30)
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, p, 4*sloShortTokens)
		if expect(t, simengine.APIChat, body).CompletionTokens >= sloShortTokens {
			prompts = append(prompts, p)
		}
	}
	shorts := make([]short, sloShort)
	started := make(chan struct{}, sloShort)
	var wg sync.WaitGroup
	for i := range sloShort {
		wg.Go(func() {
			r, err := sloStream(ctx, b.HTTP, prompts[i], 4*sloShortTokens, 0, started)
			shorts[i] = short{route: r.route, maxGap: r.maxGap, firstErr: err}
		})
	}
	for range sloShort {
		select {
		case <-started:
		case <-time.After(60 * time.Second):
			t.Fatal("short streams did not start")
		}
	}
	longRoutes := make([]string, sloLongs)
	var lwg sync.WaitGroup
	for i := range sloLongs {
		lwg.Go(func() {
			r, err := sloStream(ctx, b.HTTP, sloPrompt("long", i, sloLongWords), 4, sloITLTarget, nil)
			if err != nil {
				t.Errorf("long prompt %d: %v", i, err)
			}
			longRoutes[i] = r.route
		})
	}
	wg.Wait()
	lwg.Wait()
	for i, s := range shorts {
		if s.firstErr != nil {
			t.Fatalf("short stream %d: %v", i, s.firstErr)
		}
		if s.route != "regular" {
			continue
		}
		regular++
		if s.maxGap > sloITLTarget {
			stalled++
		}
	}
	for _, r := range longRoutes {
		if r == "pd" {
			longsPD++
		}
	}
	// The long prompts carried targets: the broker counted how they fared,
	// per route in /metrics and per pool in the fleet view.
	metrics := sloGet(t, b.HTTP+"/metrics")
	if !strings.Contains(metrics, `switchyard_slo_requests_total{model="`+model+`",result=`) {
		t.Errorf("no switchyard_slo_requests_total in /metrics")
	}
	fleet := sloGet(t, b.HTTP+"/v1/fleet")
	if !strings.Contains(fleet, `"slo":{"met":`) {
		t.Errorf("no attainment in the fleet view: %s", fleet)
	}
	if regular < 3 {
		t.Fatalf("only %d of %d short streams went to regular", regular, sloShort)
	}
	return stalled, regular, longsPD
}

// sloPrompt is a prompt of about words words, distinct per kind and i
// from its first word on, so no engine has any of it cached.
func sloPrompt(kind string, i, words int) string {
	vocab := []string{"the", "river", "carries", "stones", "down", "to", "a", "quiet", "valley", "where"}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s%d", kind, i)
	for w := 1; w < words; w++ {
		sb.WriteByte(' ')
		sb.WriteString(vocab[(w+i)%len(vocab)])
	}
	return sb.String()
}

type sloResult struct {
	route  string
	maxGap time.Duration // the longest wait between content events after the first
}

// sloStream streams a chat completion with an inter-token latency target
// itl (0: none) and measures its gaps as the client sees them; started,
// when set, is signalled at its first content event.
func sloStream(ctx context.Context, base, prompt string, maxTokens int, itl time.Duration, started chan<- struct{}) (sloResult, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return sloResult{}, err
	}
	if itl > 0 {
		req.Header.Set("x-slo-itl-ms", fmt.Sprint(itl.Milliseconds()))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return sloResult{}, err
	}
	defer resp.Body.Close()
	r := sloResult{route: resp.Header.Get("X-Switchyard-Route")}
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("status %d: %s", resp.StatusCode, readAll(resp))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last time.Time
	done := false
	for sc.Scan() {
		payload, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if payload == "[DONE]" {
			done = true
			break
		}
		if !strings.Contains(payload, `"content":"`) {
			continue
		}
		now := time.Now()
		if last.IsZero() {
			if started != nil {
				started <- struct{}{}
			}
		} else {
			r.maxGap = max(r.maxGap, now.Sub(last))
		}
		last = now
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if !done {
		return r, fmt.Errorf("stream ended without [DONE]")
	}
	return r, nil
}

// sloLearned reports what the broker has not learned yet: each pool's
// figures, as /v1/fleet shows them.
func sloLearned(base string) error {
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var f struct {
		Models []struct {
			Pools []struct {
				Pool    string `json:"pool"`
				Learned *struct {
					Samples int     `json:"samples"`
					Rate    float64 `json:"prefill_tokens_per_second"`
					ITL     float64 `json:"itl_seconds"`
					Output  float64 `json:"output_tokens"`
				} `json:"learned"`
			} `json:"pools"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		return err
	}
	if len(f.Models) != 1 {
		return fmt.Errorf("%d models in the fleet view", len(f.Models))
	}
	have := map[string]bool{}
	for _, p := range f.Models[0].Pools {
		l := p.Learned
		switch {
		case l == nil || l.Samples == 0:
		case p.Pool == "decode":
			have[p.Pool] = l.ITL > 0
		case p.Pool == "regular":
			// slo also needs how long the regular pool's answers are.
			have[p.Pool] = l.Rate > 0 && l.Output > 0
		default:
			have[p.Pool] = l.Rate > 0
		}
	}
	for _, pool := range []string{"regular", "prefill", "decode"} {
		if !have[pool] {
			return fmt.Errorf("nothing learned of the %s pool yet: %+v", pool, f.Models[0].Pools)
		}
	}
	return nil
}

func sloGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return readAll(resp)
}
