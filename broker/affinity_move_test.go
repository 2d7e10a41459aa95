package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// An offer to an agent that looks ready but never pulls its directed
// queue moves to the shared queue after the wait, same attempt, and is
// served there.
func TestOfferNotTakenMoves(t *testing.T) {
	r := newRig(t, Config{Affinity: AffinityConfig{Mode: AffinityApprox, Wait: 100 * time.Millisecond}})
	r.heartbeatOnly("lazy", 4)
	r.agent("worker", subjects.PoolRegular, "", 2, serve)
	r.waitEligible("lazy", "worker")
	long := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("many words of a long prompt ", 20) + `"}],"max_tokens":8,"stream":true}`)
	keys := oaiformat.PromptKeys(nil, 16, wire.API_API_CHAT, long)
	if len(keys) < 2 {
		t.Fatalf("%d keys", len(keys))
	}
	p := r.b.affPool(testModel, subjects.PoolRegular)
	p.tree.Insert("lazy", keys) // lazy caches the prompt: the broker offers it there
	start := time.Now()
	c, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true, Body: long})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	text, err := readAll(t, c)
	if err != nil || text != " a b" {
		t.Fatalf("text %q, %v", text, err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Fatalf("served after %s: the offer did not wait for lazy", took)
	}
	if got := p.results[resAffinity].Load(); got != 1 {
		t.Fatalf("affinity results %d, want 1", got)
	}
	if got := p.results[resNotTaken].Load(); got != 1 {
		t.Fatalf("not taken in time %d, want 1", got)
	}
	if c.retries != 0 {
		t.Fatalf("%d retries: the move is the same attempt", c.retries)
	}
	// worker took it from the shared queue: the tree now knows it too.
	if n := p.tree.AgentBlocks("worker"); n != len(keys) {
		t.Fatalf("worker has %d blocks, want %d", n, len(keys))
	}
	if l := r.b.agentLoad(testModel, "lazy"); l.offered.Load() != 0 {
		t.Fatalf("lazy still counts %d offers", l.offered.Load())
	}
}
