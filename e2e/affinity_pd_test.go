package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
)

// Prefix-cache affinity on the PD pipeline: the prompt is prefilled on the
// prefill pool, so that is where the cache pays and where the broker
// offers a turn to the agent that prefilled its conversation; the decode
// job the prefill agent publishes goes to the decode pool's shared queue
// as always.

// pdCachingEngine is a sim-engine of a PD role; a prefill engine caches
// prefixes and pays per uncached prompt token, so a hit shows in its
// counters.
func pdCachingEngine(t *testing.T, role simengine.Role) *engine {
	t.Helper()
	cfg := simengineConfig("m")
	if role == simengine.RolePrefill {
		cfg = cachingConfig()
	}
	cfg.Role, cfg.PDProtocol, cfg.BootstrapTimeout = role, simengine.PDProtocol("vllm"), 5*time.Second
	return startEngine(t, cfg)
}

func pdArgs(role string) []string { return []string{"--engine", "vllm", "--role", role} }

// pdTurn posts a chat body and checks that it went through PD and that
// its answer is byte for byte the simulator's; it returns the prefill and
// decode agents that served it.
func pdTurn(t *testing.T, base, body string) (prefill, decode string) {
	t.Helper()
	want := expect(t, simengine.APIChat, body)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text := readAll(resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, text)
	}
	var got struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(text), &got); err != nil || len(got.Choices) != 1 {
		t.Fatalf("answer %s: %v", text, err)
	}
	if c := got.Choices[0]; c.Message.Content != want.Text || c.FinishReason != want.FinishReason || got.Usage.CompletionTokens != want.CompletionTokens {
		t.Fatalf("got %q (%s, %d tokens), want %q (%s, %d)", c.Message.Content, c.FinishReason, got.Usage.CompletionTokens, want.Text, want.FinishReason, want.CompletionTokens)
	}
	if r := resp.Header.Get("X-Switchyard-Route"); r != "pd" {
		t.Fatalf("route %q, want pd", r)
	}
	prefill, decode, ok := strings.Cut(resp.Header.Get("X-Switchyard-Agent"), ",")
	if !ok {
		t.Fatalf("agent header %q names no prefill and decode agent", resp.Header.Get("X-Switchyard-Agent"))
	}
	return prefill, decode
}

// prefillAffinity returns the broker's affinity counters of the prefill
// pool.
func prefillAffinity(t *testing.T, base string) (offered uint64, fallbacks map[string]uint64) {
	t.Helper()
	a, ok, err := poolAffinity(base, subjects.PoolPrefill)
	if err != nil || !ok {
		t.Fatalf("fleet: %v (models listed: %v)", err, ok)
	}
	return a.Affinity, a.Fallbacks
}

// TestAffinityPDPrefill: a PD-only fleet, two prefill agents with caching
// engines and one decode agent. Each conversation's later turns, which
// extend its first, are prefilled on the engine that prefilled the first
// (its prefix-cache hits grow), every answer is the simulator's byte for
// byte, and the decode leg runs on the decode pool as without affinity.
func TestAffinityPDPrefill(t *testing.T) {
	// A long wait, as in TestAffinityTwoBrokersShareTheCache: on a loaded
	// machine an agent may take longer than the default to pull an offer,
	// and this test is about where offers go, not about that bound.
	b := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-wait", "3s")
	pre := map[string]*engine{"p0": pdCachingEngine(t, simengine.RolePrefill), "p1": pdCachingEngine(t, simengine.RolePrefill)}
	dec := pdCachingEngine(t, simengine.RoleDecode)
	for id, e := range pre {
		startAgent(t, b.NATS, id, e, 2, pdArgs("prefill")...)
	}
	startAgent(t, b.NATS, "dec", dec, 4, pdArgs("decode")...)
	cmdtest.WaitEligible(t, b.HTTP, "p0", "p1", "dec")

	const conversations, turns = 4, 3
	requests := 0
	for c := range conversations {
		sys := longSystem(fmt.Sprintf("pd-conversation-%d", c))
		history := []string{"first question"}
		first, d := pdTurn(t, b.HTTP, chatTurn(sys, history...))
		requests++
		if d != "dec" {
			t.Fatalf("conversation %d: decode leg on %q", c, d)
		}
		for turn := 1; turn < turns; turn++ {
			history = append(history, fmt.Sprintf("answer %d", turn), fmt.Sprintf("question %d", turn+1))
			_, hitsBefore, _ := pre[first].PrefixCache()
			p, d := pdTurn(t, b.HTTP, chatTurn(sys, history...))
			requests++
			if p != first {
				offered, fb := prefillAffinity(t, b.HTTP)
				t.Fatalf("conversation %d turn %d: prefilled on %s, its first turn on %s; prefill offers %d, fallbacks %v", c, turn, p, first, offered, fb)
			}
			if d != "dec" {
				t.Fatalf("conversation %d turn %d: decode leg on %q", c, turn, d)
			}
			if _, hits, _ := pre[first].PrefixCache(); hits <= hitsBefore {
				t.Fatalf("conversation %d turn %d: %s's engine reports no prefix-cache hit (%d -> %d)", c, turn, first, hitsBefore, hits)
			}
		}
	}
	if offered, fb := prefillAffinity(t, b.HTTP); offered < conversations*(turns-1) {
		t.Fatalf("prefill pool: %d turns offered by affinity, want %d; fallbacks %v", offered, conversations*(turns-1), fb)
	}
	// The decode engine served every request's decode leg, once.
	if n := dec.served.Load(); int(n) != requests {
		t.Fatalf("decode engine served %d legs for %d requests", n, requests)
	}
	// The decode pool keeps no affinity state: its jobs come from prefill
	// agents to its shared queue.
	a, ok, err := poolAffinity(b.HTTP, subjects.PoolDecode)
	if err != nil || !ok {
		t.Fatalf("fleet: %v (models listed: %v)", err, ok)
	}
	if a.Dispatched > 0 {
		t.Fatalf("decode pool dispatched by affinity: %+v", a)
	}
}

// TestAffinityPDPrefillAgentGone: the prefill agent caching a conversation
// is killed (a separate process whose slow heartbeat keeps it ready in the
// broker's eyes for seconds), and later one drains; the next turn is
// offered to it and still served, by the other prefill agent, with the
// decode leg as usual.
func TestAffinityPDPrefillAgentGone(t *testing.T) {
	b := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-wait", "200ms")
	e1, e2 := pdCachingEngine(t, simengine.RolePrefill), pdCachingEngine(t, simengine.RolePrefill)
	dec := pdCachingEngine(t, simengine.RoleDecode)
	startAgent(t, b.NATS, "dec", dec, 4, pdArgs("decode")...)
	bin := buildBinary(t, "github.com/switchyard-ai/switchyard/cmd/worker-agent", "worker-agent", false)
	doomed := startChild(t, bin, append([]string{"--nats-url", b.NATS, "--engine-url", e1.URL, "--id", "doomed",
		"--slots", "2", "--heartbeat", "2s", "--slow-start", "0", "--log-level", "warn"}, pdArgs("prefill")...)...)
	waitAgent(t, b.NATS, subjects.DefaultPrefix, "doomed", doomed.exited, doomed.out)
	cmdtest.WaitEligible(t, b.HTTP, "doomed", "dec")

	sys := longSystem("pd-doomed")
	if p, _ := pdTurn(t, b.HTTP, chatTurn(sys, "first question")); p != "doomed" {
		t.Fatalf("first turn prefilled on %s", p)
	}
	startAgent(t, b.NATS, "survivor", e2, 2, pdArgs("prefill")...)
	cmdtest.WaitEligible(t, b.HTTP, "survivor")

	doomed.kill()
	start := time.Now()
	if p, d := pdTurn(t, b.HTTP, chatTurn(sys, "first question", "an answer", "second question")); p != "survivor" || d != "dec" {
		t.Fatalf("second turn on %s,%s", p, d)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("second turn took %s: it waited for the dead agent to go stale", took)
	}
	if offered, fb := prefillAffinity(t, b.HTTP); offered < 1 || fb["not_taken_in_time"] < 1 {
		t.Fatalf("prefill offers %d, fallbacks %v: want the second turn offered to the dead agent and moved", offered, fb)
	}

	// Drain: the agent caching a conversation says so at once and is never
	// preferred; its conversation's next turn is prefilled elsewhere.
	e3 := pdCachingEngine(t, simengine.RolePrefill)
	drainer := startAgent(t, b.NATS, "drainer", e3, 2, pdArgs("prefill")...)
	cmdtest.WaitEligible(t, b.HTTP, "drainer")
	var sys2 string
	for i := 0; ; i++ {
		if i == 50 {
			t.Fatal("the drainer never prefilled a new conversation")
		}
		sys2 = longSystem(fmt.Sprintf("pd-drain-%d", i))
		if p, _ := pdTurn(t, b.HTTP, chatTurn(sys2, "q")); p == "drainer" {
			break
		}
	}
	if err := drainer.Stop(t); err != nil {
		t.Fatal(err)
	}
	if p, d := pdTurn(t, b.HTTP, chatTurn(sys2, "q", "a", "q2")); p != "survivor" || d != "dec" {
		t.Fatalf("turn of a drained agent's conversation on %s,%s", p, d)
	}
}

// TestAffinityMoveRace: with an affinity wait far below an agent's time
// to say it took a job, offers often move to the shared queue while their
// agent already holds them, and both agents run the attempt (JetStream
// cannot make the move and the agent's take exclusive). Every stream is
// still one agent's, byte for byte, and no second run goes on to its end:
// the broker stops it when it speaks and its engine request is aborted.
// How many races a run meets depends on the machine; it is logged.
func TestAffinityMoveRace(t *testing.T) {
	b := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-wait", "1ms")
	var engines []*engine
	for i := range 2 {
		cfg := simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 2 * time.Millisecond, Slots: 8, PrefixCacheBlocks: 4096}
		e := startEngine(t, cfg)
		engines = append(engines, e)
		startAgent(t, b.NATS, fmt.Sprintf("a%d", i), e, 4)
	}
	cmdtest.WaitEligible(t, b.HTTP, "a0", "a1")
	prompt := longSystem("race")
	want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":24}`, prompt))
	const n = 30
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range n {
		r, err := rawStream(ctx, b.HTTP, prompt, 24)
		if err != nil || !r.done || r.text != want.Text {
			t.Fatalf("request %d: %+v %v, want %q", i, r, err, want.Text)
		}
	}
	// Every engine request has ended, finished or aborted.
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		for i, e := range engines {
			if c := e.current.Load(); c != 0 {
				return fmt.Errorf("engine %d still runs %d requests", i, c)
			}
		}
		return nil
	})
	var served, finished int32
	for _, e := range engines {
		served += e.served.Load()
		finished += e.finished.Load()
	}
	if finished != n {
		t.Fatalf("engines answered %d requests to their end for %d client requests (%d started)", finished, n, served)
	}
	metrics, _ := getBody(b.HTTP + "/metrics")
	stopped := "0"
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, `switchyard_second_runs_stopped_total{stage="main"} `); ok {
			stopped = v
		}
	}
	_, offered, fb := getAffinity(t, b.HTTP)
	t.Logf("%d requests: %d offered by affinity, %d moved; %d engine requests started, %s second runs stopped by the broker",
		n, offered, fb["not_taken_in_time"], served, stopped)
}

// TestAffinityMoveRacePD: the move's race on the prefill pool. Every
// answer is byte-exact, every request's decode leg runs to its end once
// (a second prefill leg's decode job only frees its KV, or is stopped when
// it speaks), and no prefill engine is left holding KV for nobody.
func TestAffinityMoveRacePD(t *testing.T) {
	b := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-wait", "1ms")
	pre := []*engine{pdCachingEngine(t, simengine.RolePrefill), pdCachingEngine(t, simengine.RolePrefill)}
	dec := pdCachingEngine(t, simengine.RoleDecode)
	for i, e := range pre {
		startAgent(t, b.NATS, fmt.Sprintf("p%d", i), e, 4, pdArgs("prefill")...)
	}
	decMetrics := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	startAgent(t, b.NATS, "dec", dec, 8, append(pdArgs("decode"), "--metrics-listen", strings.TrimPrefix(decMetrics, "http://"))...)
	cmdtest.WaitEligible(t, b.HTTP, "p0", "p1", "dec")
	sys := longSystem("pd-race")
	const n = 20
	for range n {
		pdTurn(t, b.HTTP, chatTurn(sys, "the same question"))
	}
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		if c := dec.current.Load(); c != 0 {
			return fmt.Errorf("decode engine still runs %d requests", c)
		}
		for i, e := range pre {
			if held, _ := e.HeldKV(); held != 0 {
				return fmt.Errorf("prefill engine %d holds KV of %d requests", i, held)
			}
		}
		return nil
	})
	// Each request's decode leg ran to its end once, as the decode agent
	// counts its jobs. A second leg is muted and cancelled once it has
	// taken its KV; a leg this short (4 tokens) may still reach its end
	// in the engine before that cancel on a loaded machine (seen once
	// under -race): the engine then counts it, the agent counts it
	// cancelled.
	// The agent counts a job once its engine call has returned, a moment
	// after the engine's count: wait until it has counted as many legs
	// as the engine started, ended ok or cancelled (a leg that ended
	// otherwise leaves the wait to fail).
	jobs := func(outcome string) int { // 0 until the agent has ended one so
		v := scrapeValue(decMetrics+"/metrics", `switchyard_agent_jobs_total{outcome="`+outcome+`"}`)
		n, _ := strconv.ParseFloat(v, 64)
		return int(n)
	}
	var ok, cancelled int
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		ok, cancelled = jobs("ok"), jobs("cancelled")
		if started := int(dec.served.Load()); ok+cancelled < started {
			return fmt.Errorf("decode agent counted %d legs ok and %d cancelled of %d started", ok, cancelled, started)
		}
		return nil
	})
	if f := int(dec.finished.Load()); ok != n || f < n || f > n+cancelled {
		t.Fatalf("decode agent ended %d legs ok and %d cancelled, its engine answered %d to their end (%d started), for %d requests",
			ok, cancelled, f, dec.served.Load(), n)
	}
	// A hand-off no decode read is freed only when its hold expires: none
	// may expire here (a second prefill leg's decode job must never be
	// taken for the first's and dropped).
	for i, e := range pre {
		if x := e.HandoffsExpired(); x != 0 {
			t.Fatalf("prefill engine %d freed %d hand-offs unread at their hold timeout", i, x)
		}
	}
	offered, fb := prefillAffinity(t, b.HTTP)
	t.Logf("%d requests: %d prefill offers, %d moved; prefill legs started %d, decode legs started %d (%d ended ok, %d cancelled, %d answered to their end by the engine)",
		n, offered, fb["not_taken_in_time"], pre[0].served.Load()+pre[1].served.Load(), dec.served.Load(), ok, cancelled, dec.finished.Load())
}
