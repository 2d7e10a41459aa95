package simengine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/internal/promtext"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/kvevents"
)

// promptWords returns n distinct words starting with tag.
func promptWords(tag string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return strings.Join(w, " ")
}

func cacheConfig(blocks, blockSize int) Config {
	cfg := testConfig()
	cfg.PrefixCacheBlocks, cfg.PrefixBlockSize = blocks, blockSize
	return cfg
}

func mustStream(t *testing.T, e *Engine, api API, body string) *transcript {
	t.Helper()
	tr, err := stream(t, e, api, body)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	return tr
}

func TestPrefixCacheHits(t *testing.T) {
	e := newTestEngine(t, cacheConfig(64, 4))
	body := completionJSON(promptWords("p", 20), `"max_tokens":1`)
	tests := []struct {
		name             string
		body             string
		queries, hits    int64
		blocksAfter      int
		uncachedOfPrompt int
	}{
		// 20 tokens: 5 blocks cached after the first request.
		{name: "cold", body: body, queries: 20, hits: 0, blocksAfter: 5, uncachedOfPrompt: 20},
		// At most 19 tokens may hit: 4 blocks.
		{name: "warm", body: body, queries: 40, hits: 16, blocksAfter: 5, uncachedOfPrompt: 4},
		// Shares the first 10 words: 2 full blocks.
		{name: "shared head", body: completionJSON(promptWords("p", 10)+" "+promptWords("q", 10), `"max_tokens":1`),
			queries: 60, hits: 24, blocksAfter: 8, uncachedOfPrompt: 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _, _ := e.PrefixCache()
			tr := mustStream(t, e, APICompletion, tt.body) // not streaming: the usage comes
			q, h, n := e.PrefixCache()
			if q != tt.queries || h != tt.hits || n != tt.blocksAfter {
				t.Errorf("queries %d hits %d blocks %d, want %d %d %d", q, h, n, tt.queries, tt.hits, tt.blocksAfter)
			}
			prompt := int(q - before)
			cached := prompt - tt.uncachedOfPrompt
			if got, want := e.prefillTime(prompt, cached), e.prefillTime(tt.uncachedOfPrompt, 0); got != want {
				t.Errorf("prefill time %v, want that of %d tokens, %v", got, tt.uncachedOfPrompt, want)
			}
			// As vLLM reports them, in usage.prompt_tokens_details.
			if d := tr.usage.PromptTokensDetails; d == nil || d.CachedTokens != cached {
				t.Errorf("usage %+v, want %d cached tokens", tr.usage, cached)
			}
		})
	}
}

func TestPrefixCacheTTFT(t *testing.T) {
	cfg := cacheConfig(64, 16)
	cfg.TTFT, cfg.PrefillPerToken = 5*time.Millisecond, time.Millisecond
	e := newTestEngine(t, cfg)
	for _, tc := range []struct{ prompt, cached, want int }{
		{prompt: 100, cached: 0, want: 105},
		{prompt: 100, cached: 96, want: 9},
		{prompt: 10, cached: 20, want: 5}, // never below the base
	} {
		if got := e.prefillTime(tc.prompt, tc.cached); got != time.Duration(tc.want)*time.Millisecond {
			t.Errorf("prefillTime(%d, %d) = %v, want %dms", tc.prompt, tc.cached, got, tc.want)
		}
	}
}

func TestPrefixCacheMultiTurn(t *testing.T) {
	e := newTestEngine(t, cacheConfig(256, 4))
	system := promptWords("sys", 30)
	turn1 := chatJSON(`"max_tokens":12`, "system", system, "user", "tell me something")
	tr := mustStream(t, e, APIChat, turn1)
	q1, _, _ := e.PrefixCache()
	answered := q1 + int64(tr.usage.CompletionTokens) // words of turn 1's prompt and answer

	// The next turn re-sends the conversation: its prompt starts with turn
	// 1's prompt and answer, which the cache holds in full blocks.
	turn2 := chatJSON(`"max_tokens":4`, "system", system, "user", "tell me something",
		"assistant", tr.text(), "user", "and then")
	mustStream(t, e, APIChat, turn2)
	q2, h2, _ := e.PrefixCache()
	if want := answered / 4 * 4; h2 != want {
		t.Errorf("turn 2 hit %d tokens of %d, want %d (turn 1's prompt and answer in full blocks)", h2, q2-q1, want)
	}
}

func TestPrefixCacheEvictsLeastRecentTailFirst(t *testing.T) {
	e := newTestEngine(t, cacheConfig(8, 4))
	a := completionJSON(promptWords("a", 16), `"max_tokens":1`)
	b := completionJSON(promptWords("b", 24), `"max_tokens":1`)
	mustStream(t, e, APICompletion, a) // 4 blocks
	mustStream(t, e, APICompletion, b) // 6 more into 8: a's last two go
	if _, _, n := e.PrefixCache(); n != 8 {
		t.Fatalf("%d blocks cached, want 8", n)
	}
	_, before, _ := e.PrefixCache()
	mustStream(t, e, APICompletion, a)
	if _, h, _ := e.PrefixCache(); h-before != 8 {
		t.Errorf("a hit %d tokens after eviction, want 8 (its first two blocks)", h-before)
	}
}

func TestPrefixCacheOffByDefault(t *testing.T) {
	e := newTestEngine(t, testConfig())
	mustStream(t, e, APICompletion, completionJSON(promptWords("p", 40), `"max_tokens":1`))
	if q, h, n := e.PrefixCache(); q != 0 || h != 0 || n != 0 {
		t.Errorf("PrefixCache = %d %d %d, want zeros", q, h, n)
	}
	if e.KVEventsEndpoint() != "" {
		t.Error("an engine without KV events has an endpoint")
	}
}

func TestPrefixCacheConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
	}{
		{name: "negative blocks", cfg: func(c *Config) { c.PrefixCacheBlocks = -1 }},
		{name: "events without cache", cfg: func(c *Config) {
			c.KVEvents = kvevents.Config{Enabled: true, Publisher: "zmq", Endpoint: "tcp://127.0.0.1:0"}
		}},
		{name: "bad publisher", cfg: func(c *Config) {
			c.PrefixCacheBlocks = 8
			c.KVEvents = kvevents.Config{Enabled: true, Publisher: "kafka"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.cfg(&cfg)
			if err := cfg.Validate(); err == nil {
				t.Error("Validate = nil")
			}
		})
	}
}

func TestPrefixCacheMetrics(t *testing.T) {
	e := newTestEngine(t, cacheConfig(64, 4))
	body := completionJSON(promptWords("p", 20), `"max_tokens":1`)
	mustStream(t, e, APICompletion, body)
	mustStream(t, e, APICompletion, body)
	srv := newTestServer(t, e)
	m, err := promtext.Fetch(t.Context(), srv.Client(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		name  string
		value float64
	}{
		{"vllm:prefix_cache_queries_total", 40},
		{"vllm:prefix_cache_hits_total", 16},
	} {
		if typ := m[want.name].GetType(); typ != dto.MetricType_COUNTER {
			t.Errorf("%s is a %v, want a counter", want.name, typ)
		}
		if got := m.Sum(want.name, "model_name", "sim-model"); got != want.value {
			t.Errorf("%s = %v, want %v", want.name, got, want.value)
		}
	}
}

// updates collects a kvevents subscriber's updates.
type updates struct {
	mu sync.Mutex
	us []kvevents.Update
}

func (u *updates) add(x kvevents.Update) { u.mu.Lock(); u.us = append(u.us, x); u.mu.Unlock() }

func (u *updates) events() []kvevents.Event {
	u.mu.Lock()
	defer u.mu.Unlock()
	var es []kvevents.Event
	for _, x := range u.us {
		es = append(es, x.Batch.Events...)
	}
	return es
}

func TestPrefixCacheKVEvents(t *testing.T) {
	cfg := cacheConfig(6, 4)
	cfg.KVEvents = kvevents.Config{Enabled: true, Publisher: "zmq", Endpoint: "tcp://127.0.0.1:0", Topic: "kv@sim"}
	e := newTestEngine(t, cfg)
	t.Cleanup(func() { _ = e.Close() })
	ep := e.KVEventsEndpoint()
	if ep == "" || strings.HasSuffix(ep, ":0") {
		t.Fatalf("KVEventsEndpoint = %q", ep)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := &updates{}
	done := make(chan error, 1)
	go func() {
		done <- kvevents.NewSubscriber(ep, "kv@", kvevents.WithRetry(20*time.Millisecond)).Run(ctx, got.add)
	}()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if e.kvpub.Subscribers() == 0 {
			return fmt.Errorf("no subscriber yet")
		}
		return nil
	})

	// A chat prompt's blocks are named by the broker's chat keys.
	msgs := []affinity.Message{{Role: "system", Content: promptWords("s", 12)}, {Role: "user", Content: "hi"}}
	mustStream(t, e, APIChat, chatJSON(`"max_tokens":1`, "system", msgs[0].Content, "user", "hi"))
	broker := affinity.AppendChatKeys(nil, 4, msgs) // 17 words: 4 blocks
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if len(got.events()) == 0 {
			return fmt.Errorf("no event yet")
		}
		return nil
	})
	ev := got.events()[0]
	if ev.Kind != kvevents.BlockStored || !slices.Equal(ev.Hashes, broker) || ev.HasParent ||
		ev.BlockSize != 4 || len(ev.TokenIDs) != 16 || ev.Medium != kvevents.MediumGPU {
		t.Fatalf("first event = %+v, want BlockStored of the broker's keys %x", ev, broker)
	}

	// A second prompt of 3 blocks into 6: the first prompt's last block
	// is evicted, then the new blocks stored.
	other := promptWords("o", 12)
	mustStream(t, e, APICompletion, completionJSON(other, `"max_tokens":1`))
	otherKeys := affinity.AppendKeys(nil, 4, other)
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if len(got.events()) < 3 {
			return fmt.Errorf("%d events", len(got.events()))
		}
		return nil
	})
	es := got.events()[1:]
	if es[0].Kind != kvevents.BlockRemoved || !slices.Equal(es[0].Hashes, broker[3:]) {
		t.Errorf("event = %+v, want BlockRemoved of %x", es[0], broker[3:])
	}
	if es[1].Kind != kvevents.BlockStored || !slices.Equal(es[1].Hashes, otherKeys) {
		t.Errorf("event = %+v, want BlockStored of %x", es[1], otherKeys)
	}
	if err := e.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}
