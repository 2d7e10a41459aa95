package kvevents_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/simengine"
)

// TestPrecisePathFromSimEngine runs the precise source end to end: a
// sim-engine publishes its KV events on a real socket, a subscriber
// applies them to a tree as the agent and broker will, and the broker's
// keys of the next turn find what the engine holds, eviction included.
func TestPrecisePathFromSimEngine(t *testing.T) {
	cfg := simengine.Config{Model: "m", Slots: 2, PrefixCacheBlocks: 8, PrefixBlockSize: 4,
		KVEvents: kvevents.Config{Enabled: true, Publisher: "zmq", Endpoint: "tcp://127.0.0.1:0"}}
	eng, err := simengine.New(cfg, simengine.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()

	tree := affinity.NewTree(affinity.TreeConfig{})
	var (
		mu      sync.Mutex
		batches int
	)
	apply := func(u kvevents.Update) {
		if u.Resync {
			tree.Cleared("agent-1")
		}
		tree.Removed("agent-1", u.Summary.Removed)
		tree.Stored("agent-1", u.Summary.Stored)
		mu.Lock()
		batches++
		mu.Unlock()
	}
	seen := func() int { mu.Lock(); defer mu.Unlock(); return batches }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- kvevents.NewSubscriber(eng.KVEventsEndpoint(), "", kvevents.WithRetry(20*time.Millisecond)).Run(ctx, apply)
	}()
	defer func() { cancel(); <-done }()

	words := func(tag string, n int) string {
		w := make([]string, n)
		for i := range w {
			w[i] = fmt.Sprintf("%s%d", tag, i)
		}
		return strings.Join(w, " ")
	}
	send := func(prompt string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
		if err := eng.Stream(t.Context(), simengine.APICompletion, []byte(body), func([]byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// Until the subscription reaches the engine its events are lost (ZMQ's
	// slow joiner), so warm up with throwaway prompts.
	testwait.For(t, 5*time.Second, 20*time.Millisecond, func() error {
		send(words(fmt.Sprintf("warm%d-", time.Now().UnixNano()), 4))
		if seen() == 0 {
			return fmt.Errorf("no batch yet")
		}
		return nil
	})

	conv := words("c", 16) // 4 blocks
	send(conv)
	keys := affinity.AppendKeys(nil, 4, conv+" next question here ok")
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if m := tree.Match(keys, nil); len(m) != 1 || m[0].Blocks != 4 || !m[0].Precise {
			return fmt.Errorf("match %+v, want agent-1 with 4 precise blocks", m)
		}
		return nil
	})

	// Two other prompts of 4 blocks into 8 evict the conversation.
	send(words("x", 16))
	send(words("y", 16))
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if m := tree.Match(keys, nil); len(m) != 0 {
			return fmt.Errorf("match %+v after eviction, want none", m)
		}
		return nil
	})
}
