package broker

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
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

// An attempt that fails on its agent before the first token is forgotten
// in the tree (its agent's engine never cached the prompt), unless
// another request sent the blocks there; the retry's agent is learnt.
func TestFailedAttemptForgotten(t *testing.T) {
	// No offers (a fake agent pulls only the shared queue): the test is
	// about what the tree learns.
	g := DefaultAffinityGuard()
	g.MinBlocks = 1000
	r := newRig(t, Config{Affinity: AffinityConfig{Mode: AffinityApprox, Guard: g}})
	held := make(chan struct{})
	bad := r.agent("bad", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ERROR, Error: &wire.Error{Code: wire.CodeEngineDown, Message: "engine gone", Retryable: true}})
		// Hold the slot: bad takes no more and, still ready, keeps its
		// place in the tree (a draining agent would leave it).
		<-held
	})
	t.Cleanup(func() { close(held) }) // before the agent's own cleanup
	r.waitEligible("bad")
	long := longBody()
	keys := oaiformat.PromptKeys(nil, 16, wire.API_API_CHAT, long)
	p := r.b.affPool(testModel, subjects.PoolRegular)
	// Another request sent bad the prompt's first block before.
	p.tree.Insert("bad", keys[:1])
	c, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true, Body: long})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if bad.pulled.Load() == 0 {
			return errors.New("bad has not pulled yet")
		}
		return nil
	})
	r.agent("good", subjects.PoolRegular, "", 1, serve)
	text, err := readAll(t, c)
	if err != nil || text != " a b" || c.retries != 1 {
		t.Fatalf("text %q, %v, %d retries", text, err, c.retries)
	}
	if n := p.tree.AgentBlocks("bad"); n != 1 {
		t.Fatalf("bad holds %d blocks, want the 1 another request sent it", n)
	}
	if n := p.tree.AgentBlocks("good"); n != len(keys) {
		t.Fatalf("good holds %d blocks, want %d", n, len(keys))
	}
}

// A learn message goes out only when someone may listen: not when the
// broker's own subscription is the only one (LearnListeners says 1), yes
// for a peer (2) and when the count misses the broker's own (0).
func TestLearnOnlyWhenSomeoneListens(t *testing.T) {
	var listeners atomic.Int32
	r := newRig(t, Config{Affinity: AffinityConfig{Mode: AffinityApprox}, LearnListeners: func(string) int { return int(listeners.Load()) }})
	sub, err := r.nc.SubscribeSync("sy.learn.>") // the rig's connection echoes the broker's publishes
	if err != nil {
		t.Fatal(err)
	}
	r.agent("worker", subjects.PoolRegular, "", 2, serve)
	r.waitEligible("worker")
	for _, n := range []int32{1, 2, 0, 1} {
		listeners.Store(n)
		c, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true, Body: longBody()})
		if err != nil {
			t.Fatal(err)
		}
		if text, err := readAll(t, c); err != nil || text != " a b" {
			t.Fatalf("text %q, %v", text, err)
		}
		c.Close()
	}
	if err := r.nc.Flush(); err != nil { // every publish of the broker has come back
		t.Fatal(err)
	}
	if n, _, _ := sub.Pending(); n != 2 {
		t.Fatalf("%d learn messages for 4 requests, want 2 (with listeners 2 and 0)", n)
	}
}
