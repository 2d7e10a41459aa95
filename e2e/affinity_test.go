package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// Prefix-cache affinity end to end: directed jobs that outlive
// their agent, the slot bound with both queues full, and two brokers
// sharing what they learnt.

// cachingEngine is a sim-engine with a prefix cache whose prefill costs
// per uncached prompt token, so a cache hit shows in its counters.
func cachingEngine(t *testing.T) *engine {
	t.Helper()
	return startEngine(t, cachingConfig())
}

func cachingConfig() simengine.Config {
	cfg := simengineConfig("m")
	cfg.PrefixCacheBlocks = 4096
	cfg.PrefillPerToken = 10 * time.Microsecond
	return cfg
}

// eventsEngine is a caching engine that publishes its KV events on ZMQ,
// naming its blocks as hash says (simengine.KVHashBroker or KVHashTokens).
func eventsEngine(t *testing.T, hash string) *engine {
	t.Helper()
	cfg := cachingConfig()
	cfg.KVHash = hash
	cfg.KVEvents = kvevents.Config{Enabled: true, Publisher: "zmq", Endpoint: "tcp://127.0.0.1:0"}
	return startEngine(t, cfg)
}

// chatTurn is a conversation's request body: the system prompt, then the
// turns (user, assistant, user, ...).
func chatTurn(system string, turns ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", system}}
	for i, c := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, c})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 4})
	return string(b)
}

// longSystem is a system prompt of some hundred words, tag making it one
// conversation's own.
func longSystem(tag string) string {
	return tag + " " + strings.Repeat("you are a careful assistant that answers briefly and well ", 16)
}

// servedBy posts body and returns the index of the engine whose served
// count grew.
func servedBy(t *testing.T, base, body string, engines ...*engine) int {
	t.Helper()
	before := make([]int32, len(engines))
	for i, e := range engines {
		before[i] = e.served.Load()
	}
	if code, out := post(t, base+"/v1/chat/completions", body); code != http.StatusOK {
		t.Fatalf("status %d: %s", code, out)
	}
	for i, e := range engines {
		if e.served.Load() > before[i] {
			return i
		}
	}
	t.Fatal("no engine served the request")
	return -1
}

// poolAffinityView is one pool's affinity in the broker's /v1/fleet.
type poolAffinityView struct {
	Dispatched uint64            `json:"dispatched"`
	Affinity   uint64            `json:"affinity"`
	Fallbacks  map[string]uint64 `json:"fallbacks"`
	Blocks     int               `json:"blocks"`
}

// poolAffinity reads pool's affinity from the broker's fleet view; ok is
// false when the view has no model yet.
func poolAffinity(base, pool string) (v poolAffinityView, ok bool, err error) {
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		return v, false, err
	}
	defer resp.Body.Close()
	var f struct {
		Models []struct {
			Affinity map[string]poolAffinityView `json:"affinity"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil || len(f.Models) == 0 {
		return v, false, err
	}
	return f.Models[0].Affinity[pool], true, nil
}

func getAffinity(t *testing.T, base string) (dispatched, offered uint64, fallbacks map[string]uint64) {
	t.Helper()
	a, ok, err := poolAffinity(base, subjects.PoolRegular)
	if err != nil || !ok {
		t.Fatalf("fleet: %v (models listed: %v)", err, ok)
	}
	return a.Dispatched, a.Affinity, a.Fallbacks
}

// treeBlocks is the regular pool's (block, agent) entries in a broker's
// affinity tree, as its fleet view shows them.
func treeBlocks(t *testing.T, base string) int {
	t.Helper()
	a, ok, err := poolAffinity(base, subjects.PoolRegular)
	if err != nil || !ok {
		t.Fatalf("fleet: %v (models listed: %v)", err, ok)
	}
	return a.Blocks
}

// TestAffinityDirectedJobOutlivesItsAgent: the agent caching a prompt is
// killed (a separate process, so nothing says goodbye; its slow heartbeat
// keeps it ready in the broker's eyes for seconds) or drains; the next
// turn of that conversation is offered to it first and still served, by
// the other agent, well before the dead agent would be judged stale.
func TestAffinityDirectedJobOutlivesItsAgent(t *testing.T) {
	b := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-wait", "200ms")
	e1, e2 := cachingEngine(t), cachingEngine(t)
	bin := buildBinary(t, "github.com/switchyard-ai/switchyard/cmd/worker-agent", "worker-agent", false)
	// The doomed agent heartbeats every 2s: stale only after 6s.
	doomed := startChild(t, bin, "--nats-url", b.NATS, "--engine", "openai", "--engine-url", e1.URL, "--id", "doomed",
		"--slots", "2", "--heartbeat", "2s", "--slow-start", "0", "--log-level", "warn")
	waitAgent(t, b.NATS, subjects.DefaultPrefix, "doomed", doomed.exited, doomed.out)
	cmdtest.WaitEligible(t, b.HTTP, "doomed")

	sys := longSystem("conv-a")
	if got := servedBy(t, b.HTTP, chatTurn(sys, "first question"), e1, e2); got != 0 {
		t.Fatalf("first turn served by engine %d", got)
	}
	startAgent(t, b.NATS, "survivor", e2, 2)
	cmdtest.WaitEligible(t, b.HTTP, "survivor")

	doomed.kill()
	start := time.Now()
	if got := servedBy(t, b.HTTP, chatTurn(sys, "first question", "an answer", "second question"), e1, e2); got != 1 {
		t.Fatalf("second turn served by engine %d", got)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("second turn took %s: it waited for the dead agent to go stale", took)
	}
	_, offered, fb := getAffinity(t, b.HTTP)
	if offered < 1 || fb["not_taken_in_time"] < 1 {
		t.Fatalf("offered %d, fallbacks %v: want the second turn offered to the dead agent and moved", offered, fb)
	}

	// Drain: the caching agent says so at once and is never preferred; a
	// conversation it cached goes to the shared queue.
	e3 := cachingEngine(t)
	drainer := startAgent(t, b.NATS, "drainer", e3, 2)
	cmdtest.WaitEligible(t, b.HTTP, "drainer")
	// New conversations until the drainer holds one (a prefix nobody
	// holds goes to the shared queue, where either agent may take it).
	var sys2 string
	for i := 0; ; i++ {
		if i == 50 {
			t.Fatal("the drainer never took a new conversation")
		}
		sys2 = longSystem(fmt.Sprintf("conv-b%d", i))
		if servedBy(t, b.HTTP, chatTurn(sys2, "q"), e2, e3) == 1 {
			break
		}
	}
	if err := drainer.Stop(t); err != nil {
		t.Fatal(err)
	}
	if got := servedBy(t, b.HTTP, chatTurn(sys2, "q", "a", "q2"), e2, e3); got != 0 {
		t.Fatalf("turn of a drained agent's conversation served by engine %d", got)
	}
}

// TestAffinityAgentNeverAboveSlots fills an agent's directed queue and its
// pool's shared queue at once: the agent's two pulls share one bound, so
// its engine never runs more than its slots, and every job is served.
func TestAffinityAgentNeverAboveSlots(t *testing.T) {
	b := cmdtest.StartBroker(t)
	cfg := simengineConfig("m")
	cfg.ITL = 5 * time.Millisecond
	cfg.Slots = 64
	e := startEngine(t, cfg)
	const slots = 3
	startAgent(t, b.NATS, "a1", e, slots)
	nc, err := nats.Connect(b.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subj := subjects.Must(subjects.DefaultPrefix)
	shared, _ := subj.Jobs("m", subjects.PoolRegular)
	directed, _ := subj.Directed("m", subjects.PoolRegular, "", "a1")
	reply := nats.NewInbox()
	finals := make(chan string, 64)
	sub, err := nc.Subscribe(reply, func(m *nats.Msg) {
		_ = wire.Frames(m.Data, func(b []byte) error {
			var c wire.Chunk
			if proto.Unmarshal(b, &c) == nil && (c.GetKind() == wire.Chunk_KIND_FINAL || c.GetKind() == wire.Chunk_KIND_ERROR) {
				finals <- c.GetRequestId()
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	const n = 12
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 2 * n {
		to := shared
		if i%2 == 0 {
			to = directed
		}
		job := &wire.Job{RequestId: fmt.Sprintf("r%d", i), Model: "m", Api: wire.API_API_CHAT, Stream: true,
			Body:         []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"stream":true}`),
			ReplySubject: reply, Deadline: timestamppb.New(time.Now().Add(time.Minute))}
		data, _ := proto.Marshal(job)
		if _, err := js.Publish(ctx, to, data); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < 2*n {
		select {
		case id := <-finals:
			seen[id] = true
		case <-ctx.Done():
			t.Fatalf("%d of %d jobs ended", len(seen), 2*n)
		}
	}
	if p := e.peak.Load(); p > slots {
		t.Fatalf("engine ran %d requests at once, agent has %d slots", p, slots)
	}
	if p := e.peak.Load(); p < slots {
		t.Logf("peak %d below slots %d", p, slots)
	}
}

// TestAffinityTwoBrokersShareTheCache: conversations start on one broker
// and continue on another on the same NATS; the second broker sends each
// next turn to the agent whose engine cached the first, which its engine's
// prefix-cache hits show.
func TestAffinityTwoBrokersShareTheCache(t *testing.T) {
	// A long wait: on a loaded machine (the race detector, other tests) an
	// agent may take more than the default 200ms to pull an offer, which
	// then moves to the shared queue, to any agent; this test is about
	// what the second broker knows, not about that bound.
	b1 := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-wait", "3s")
	b2 := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-wait", "3s", "--nats-url", b1.NATS)
	engines := []*engine{cachingEngine(t), cachingEngine(t), cachingEngine(t)}
	for i, e := range engines {
		startAgent(t, b1.NATS, fmt.Sprintf("a%d", i), e, 2)
	}
	cmdtest.WaitEligible(t, b1.HTTP, "a0", "a1", "a2")
	cmdtest.WaitEligible(t, b2.HTTP, "a0", "a1", "a2")
	for c := range 6 {
		sys := longSystem(fmt.Sprintf("conversation-%d", c))
		known := treeBlocks(t, b2.HTTP)
		first := servedBy(t, b1.HTTP, chatTurn(sys, "first question"), engines...)
		_, hitsBefore, _ := engines[first].PrefixCache()
		// The first broker's accept reaches the second through NATS, as a
		// learn message, usually while the first turn still runs. On a
		// loaded machine it was seen to come after the next turn was
		// dispatched (a no_match): wait for it in the second broker's
		// tree, a state; how soon it comes is not what this test is about.
		testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
			if n := treeBlocks(t, b2.HTTP); n <= known {
				return fmt.Errorf("broker 2's tree holds %d blocks, as before the first turn", n)
			}
			return nil
		})
		next := servedBy(t, b2.HTTP, chatTurn(sys, "first question", "an answer", "second question"), engines...)
		if next != first {
			d, o, fb := getAffinity(t, b2.HTTP)
			t.Fatalf("conversation %d: first turn on engine %d (broker 1), next turn on engine %d (broker 2); broker 2 dispatched %d, offered %d, fallbacks %v",
				c, first, next, d, o, fb)
		}
		if _, hits, _ := engines[first].PrefixCache(); hits <= hitsBefore {
			t.Fatalf("conversation %d: engine %d reports no prefix-cache hit for the next turn (%d -> %d)", c, first, hitsBefore, hits)
		}
	}
	if _, offered, _ := getAffinity(t, b2.HTTP); offered < 6 {
		t.Fatalf("broker 2 offered %d turns by affinity, want 6", offered)
	}
}

// TestAffinityPreciseFromEngineEvents: the first broker runs pure pull and
// shares nothing; the second, in precise mode, learns where each
// conversation is cached only from the KV events the agents forward from
// their engines, and sends the next turn there.
func TestAffinityPreciseFromEngineEvents(t *testing.T) {
	b1 := cmdtest.StartBroker(t, "--affinity", "off")
	b2 := cmdtest.StartBroker(t, "--affinity", "precise", "--affinity-wait", "3s", "--nats-url", b1.NATS)
	var engines []*engine
	for i := range 3 {
		e := eventsEngine(t, simengine.KVHashBroker)
		engines = append(engines, e)
		startAgent(t, b1.NATS, fmt.Sprintf("p%d", i), e, 2, "--kv-events-endpoint", e.KVEventsEndpoint())
	}
	cmdtest.WaitEligible(t, b2.HTTP, "p0", "p1", "p2")
	for c := range 4 {
		sys := longSystem(fmt.Sprintf("precise-%d", c))
		first := servedBy(t, b1.HTTP, chatTurn(sys, "first question"), engines...)
		// The engine's events reach the second broker through the agent:
		// wait until its tree holds every block the engines hold. (Any
		// growth was not enough: the last conversation's second turn may
		// store blocks whose events come after this turn's.)
		waitTreeHoldsEngines(t, b2.HTTP, engines)
		next := servedBy(t, b2.HTTP, chatTurn(sys, "first question", "an answer", "second question"), engines...)
		if next != first {
			d, o, fb := getAffinity(t, b2.HTTP)
			t.Fatalf("conversation %d: first turn on engine %d (broker 1, pure pull), next turn on engine %d (broker 2, precise); dispatched %d, offered %d, fallbacks %v",
				c, first, next, d, o, fb)
		}
	}
}

// TestAffinityPreciseTranslatedFromVLLMHashes: the engines name their
// blocks as real vLLM does (token ids over their own ChatML template,
// seeded hashes), so their KV events mean nothing to the broker as they
// are. Agents with --kv-events-hash vllm tokenize each prompt with the
// engine and translate; the precise broker then sends each next turn to
// the engine that cached the conversation. Forwarded untranslated
// (--kv-events-hash broker), the same events match nothing.
func TestAffinityPreciseTranslatedFromVLLMHashes(t *testing.T) {
	for _, tc := range []struct {
		hash      string
		translate bool
	}{{"vllm", true}, {"broker", false}} {
		t.Run(tc.hash, func(t *testing.T) {
			b1 := cmdtest.StartBroker(t, "--affinity", "off")
			b2 := cmdtest.StartBroker(t, "--affinity", "precise", "--affinity-wait", "3s", "--nats-url", b1.NATS)
			var engines []*engine
			var ids []string
			for i := range 3 {
				e := eventsEngine(t, simengine.KVHashTokens)
				engines = append(engines, e)
				id := fmt.Sprintf("%s%d", tc.hash, i)
				ids = append(ids, id)
				startAgent(t, b1.NATS, id, e, 2, "--kv-events-endpoint", e.KVEventsEndpoint(), "--kv-events-hash", tc.hash)
			}
			cmdtest.WaitEligible(t, b2.HTTP, ids...)
			known := 0
			const conversations = 4
			for c := range conversations {
				sys := longSystem(fmt.Sprintf("vllm-hash-%d", c))
				first := servedBy(t, b1.HTTP, chatTurn(sys, "first question"), engines...)
				// Translated or not, the events reach broker 2's tree.
				known = waitMoreBlocks(t, b2.HTTP, known)
				_, hitsBefore, _ := engines[first].PrefixCache()
				next := servedBy(t, b2.HTTP, chatTurn(sys, "first question", "an answer", "second question"), engines...)
				if !tc.translate {
					continue
				}
				if next != first {
					d, o, fb := getAffinity(t, b2.HTTP)
					t.Fatalf("conversation %d: first turn on engine %d (broker 1, pure pull), next turn on engine %d (broker 2, precise); dispatched %d, offered %d, fallbacks %v",
						c, first, next, d, o, fb)
				}
				if _, hits, _ := engines[first].PrefixCache(); hits <= hitsBefore {
					t.Fatalf("conversation %d: engine %d reports no prefix-cache hit for the next turn (%d -> %d)", c, first, hitsBefore, hits)
				}
			}
			_, offered, fallbacks := getAffinity(t, b2.HTTP)
			switch {
			case tc.translate && offered < conversations:
				t.Fatalf("broker 2 offered %d turns by affinity, want %d (fallbacks %v)", offered, conversations, fallbacks)
			case !tc.translate && offered != 0:
				t.Fatalf("untranslated engine hashes matched: broker 2 offered %d turns by affinity", offered)
			}
		})
	}
}

// waitTreeHoldsEngines waits until the broker's tree of the regular pool
// holds as many (block, agent) entries as the engines' prefix caches hold
// blocks: engines that name their blocks with the broker's keys, one
// agent each, and no eviction.
func waitTreeHoldsEngines(t *testing.T, base string, engines []*engine) {
	t.Helper()
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		want := 0
		for _, e := range engines {
			_, _, blocks := e.PrefixCache()
			want += blocks
		}
		if n := affinityBlocks(t, base); n < want {
			return fmt.Errorf("broker at %s holds %d blocks, the engines %d", base, n, want)
		}
		return nil
	})
}

// waitMoreBlocks waits until the broker's tree of the regular pool holds
// more than known blocks, and returns how many.
func waitMoreBlocks(t *testing.T, base string, known int) int {
	t.Helper()
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		n := affinityBlocks(t, base)
		if n <= known {
			return fmt.Errorf("broker at %s holds %d blocks, had %d", base, n, known)
		}
		known = n
		return nil
	})
	return known
}

func affinityBlocks(t *testing.T, base string) int {
	t.Helper()
	a, _, err := poolAffinity(base, subjects.PoolRegular)
	if err != nil {
		return 0 // polled: the caller's wait reports what it waited for
	}
	return a.Blocks
}
