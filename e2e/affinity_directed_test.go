package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
)

// The directed queues' stream on a cluster: one replica beside a
// replicated jobs stream, and an offer that outlives that stream.

func clusterJS(t *testing.T, c *natstest.Cluster) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(c.URLs(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestAffinityDirectedConsumersOneReplica: with the jobs stream at R3 on a
// 3-node cluster, the agents' directed consumers have one replica (no
// followers), while the pool's shared consumer has the jobs stream's three.
func TestAffinityDirectedConsumersOneReplica(t *testing.T) {
	c := natstest.RunCluster(t, "sy", 3)
	b := cmdtest.StartBroker(t, "--nats-url", c.URLs(0), "--replicas", "3")
	e := cachingEngine(t)
	startAgent(t, c.URLs(1), "a1", e, 2)
	startAgent(t, c.URLs(2), "a2", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")
	js := clusterJS(t, c)
	ctx := context.Background()
	dirStream := subjects.DirectedStream(broker.DefaultStream)

	for _, tc := range []struct {
		stream   string
		replicas int
	}{{broker.DefaultStream, 3}, {dirStream, 1}} {
		st, err := js.Stream(ctx, tc.stream)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.Replicas; got != tc.replicas {
			t.Errorf("stream %s: replicas %d, want %d", tc.stream, got, tc.replicas)
		}
	}
	followers := func(stream, name string) int {
		var n int
		testwait.For(t, 30*time.Second, 50*time.Millisecond, func() error {
			cons, err := js.Consumer(ctx, stream, name)
			if err != nil {
				return err
			}
			info := cons.CachedInfo()
			if info.Cluster == nil || info.Cluster.Leader == "" {
				return fmt.Errorf("consumer %s has no leader yet", name)
			}
			n = len(info.Cluster.Replicas)
			if info.Config.Replicas > 1 {
				n = max(n, info.Config.Replicas-1)
			}
			return nil
		})
		return n
	}
	for _, id := range []string{"a1", "a2"} {
		name, err := subjects.DirectedConsumerName("m", subjects.PoolRegular, "", id)
		if err != nil {
			t.Fatal(err)
		}
		if n := followers(dirStream, name); n != 0 {
			t.Errorf("directed consumer of %s has %d followers, want none (one replica)", id, n)
		}
	}
	shared, _ := subjects.ConsumerName("m", subjects.PoolRegular)
	if n := followers(broker.DefaultStream, shared); n != 2 {
		t.Errorf("shared consumer has %d followers, want 2 (the jobs stream's three replicas)", n)
	}
}

// TestAffinityDirectedJobSurvivesItsStream: an offer waits in the
// directed queue of its agent, which is busy; then the directed stream is
// deleted, or the one server holding it is lost. The offer still ends as a
// job of the shared queue, served, and the next offers go to the shared
// queue at once until the stream is back.
func TestAffinityDirectedJobSurvivesItsStream(t *testing.T) {
	c := natstest.RunCluster(t, "sy", 3)
	b := cmdtest.StartBroker(t, "--nats-url", c.URLs(0), "--replicas", "3", "--affinity", "approx",
		"--affinity-wait", "2s", "--request-timeout", "60s")
	cfg := cachingConfig()
	cfg.TTFT = 1500 * time.Millisecond
	e := startEngine(t, cfg)
	startAgent(t, c.URLs(1), "a1", e, 1)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	js := clusterJS(t, c)
	dirStream := subjects.DirectedStream(broker.DefaultStream)

	for _, how := range []string{"deleted", "server lost"} {
		sys := longSystem("conv " + how)
		// The first turn teaches the broker that a1 caches the prompt.
		if got := servedBy(t, b.HTTP, chatTurn(sys, "first"), e); got != 0 {
			t.Fatalf("%s: first turn served by %d", how, got)
		}
		// Another conversation fills a1's one slot; the second turn is
		// then offered to a1 and waits in its directed queue.
		results := make(chan error, 2)
		postAsync := func(body string) {
			go func() {
				code, out := post(t, b.HTTP+"/v1/chat/completions", body)
				if code != http.StatusOK {
					results <- fmt.Errorf("status %d: %s", code, out)
					return
				}
				results <- nil
			}()
		}
		postAsync(chatTurn(longSystem("filler "+how), "q"))
		testwait.For(t, 30*time.Second, 5*time.Millisecond, func() error {
			if e.current.Load() < 1 {
				return errors.New("a1 not busy yet")
			}
			return nil
		})
		postAsync(chatTurn(sys, "first", "an answer", "second"))
		var holder string
		testwait.For(t, 30*time.Second, 5*time.Millisecond, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			st, err := js.Stream(ctx, dirStream)
			if err != nil {
				return err
			}
			info := st.CachedInfo()
			if info.State.Msgs < 1 {
				return errors.New("no offer waiting in the directed stream")
			}
			if info.Cluster != nil {
				holder = info.Cluster.Leader
			}
			return nil
		})
		switch how {
		case "deleted":
			if err := js.DeleteStream(context.Background(), dirStream); err != nil {
				t.Fatal(err)
			}
		default:
			lost := -1
			for i, s := range c.Servers {
				if s != nil && s.Name() == holder {
					lost = i
				}
			}
			if lost < 0 {
				t.Fatalf("no server named %q holds the directed stream", holder)
			}
			c.Stop(lost)
		}
		for range 2 {
			select {
			case err := <-results:
				if err != nil {
					t.Fatalf("%s: %v", how, err)
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("%s: requests not answered", how)
			}
		}
		if how == "deleted" {
			// The broker makes the stream again.
			testwait.For(t, 30*time.Second, 50*time.Millisecond, func() error {
				_, err := js.Stream(context.Background(), dirStream)
				return err
			})
		}
	}
	_, _, fb := getAffinity(t, b.HTTP)
	if fb["not_taken_in_time"] < 2 {
		t.Fatalf("fallbacks %v: want both offers moved to the shared queue", fb)
	}
	// The broker stays ready without the directed stream: affinity
	// degrades to the shared queue.
	resp, err := http.Get(b.HTTP + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz %d with the directed stream's server lost", resp.StatusCode)
	}
	// With the directed stream's server lost, a new turn of a cached
	// conversation is served from the shared queue.
	if got := servedBy(t, b.HTTP, chatTurn(longSystem("conv server lost"), "first", "an answer", "second", "x", "third"), e); got != 0 {
		t.Fatalf("turn after the loss served by %d", got)
	}
}
