package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// collector gathers a subscriber's updates.
type collector struct {
	mu sync.Mutex
	us []Update
}

func (c *collector) add(u Update) {
	c.mu.Lock()
	c.us = append(c.us, u)
	c.mu.Unlock()
}

func (c *collector) get() []Update {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.us)
}

func startSubscriber(t *testing.T, endpoint, topic string) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{}
	done := make(chan error, 1)
	s := NewSubscriber(endpoint, topic, WithRetry(20*time.Millisecond))
	go func() { done <- s.Run(ctx, c.add) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return c
}

func stored(h ...uint64) []Event {
	return []Event{{Kind: BlockStored, Hashes: h, BlockSize: 16, Medium: MediumGPU}}
}

// publishUntil publishes stored(marker) until the subscriber has seen an
// update: a ZMQ subscriber misses what is sent before its subscription
// reaches the publisher.
func publishUntil(t *testing.T, p *Publisher, c *collector, marker uint64) {
	t.Helper()
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if err := p.Publish(stored(marker)); err != nil {
			return err
		}
		if len(c.get()) == 0 {
			return errors.New("no update yet")
		}
		return nil
	})
}

func TestPublishSubscribe(t *testing.T) {
	p, err := Listen("tcp://127.0.0.1:0", "kv@sim")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !strings.HasPrefix(p.Endpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(p.Endpoint(), ":0") {
		t.Fatalf("Endpoint = %q", p.Endpoint())
	}
	c := startSubscriber(t, p.Endpoint(), "kv@")
	other := startSubscriber(t, p.Endpoint(), "other-topic")
	publishUntil(t, p, c, 1)

	for i := range uint64(5) {
		if err := p.Publish(stored(100 + i)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if us := c.get(); us[len(us)-1].Summary.Stored[0] != 104 {
			return fmt.Errorf("last update %+v", us[len(us)-1].Summary)
		}
		return nil
	})
	us := c.get()
	if !us[0].Resync {
		t.Error("first update of a connection is not a resync")
	}
	for i := 1; i < len(us); i++ {
		if us[i].Seq != us[i-1].Seq+1 || us[i].Resync {
			t.Errorf("update %d: seq %d after %d, resync %v", i, us[i].Seq, us[i-1].Seq, us[i].Resync)
		}
	}
	if b := us[len(us)-1].Batch; len(b.Events) != 1 || b.Events[0].BlockSize != 16 || time.Since(b.Time) > time.Minute {
		t.Errorf("batch = %+v", b)
	}
	if n := len(other.get()); n != 0 {
		t.Errorf("a subscriber of another topic got %d updates", n)
	}
}

func TestSubscriberReconnects(t *testing.T) {
	// Reserve a port, so that the restarted publisher binds the same one.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + ln.Addr().String()
	ln.Close()

	c := startSubscriber(t, endpoint, "") // before the engine is up
	p, err := Listen(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	publishUntil(t, p, c, 1)
	for range 3 {
		_ = p.Publish(stored(2))
	}
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := len(c.get()); n < 4 {
			return fmt.Errorf("%d updates", n)
		}
		return nil
	})
	p.Close()

	// The engine restarts: its sequence starts again at 0.
	p2, err := Listen(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	before := len(c.get())
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		_ = p2.Publish(stored(3))
		if len(c.get()) == before {
			return errors.New("nothing from the restarted engine")
		}
		return nil
	})
	u := c.get()[before]
	if !u.Resync || u.Summary.Stored[0] != 3 {
		t.Errorf("first update after the restart = %+v, want a resync storing 3", u)
	}
}

func TestSubscriberReportsGap(t *testing.T) {
	p, err := Listen("tcp://127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := startSubscriber(t, p.Endpoint(), "")
	publishUntil(t, p, c, 1)
	p.mu.Lock()
	p.seq += 5 // five batches lost
	p.mu.Unlock()
	if err := p.Publish(stored(9)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		us := c.get()
		if u := us[len(us)-1]; len(u.Summary.Stored) == 0 || u.Summary.Stored[0] != 9 {
			return errors.New("not yet")
		}
		return nil
	})
	us := c.get()
	if u := us[len(us)-1]; !u.Resync {
		t.Errorf("update after a gap = %+v, want resync", u)
	}
}

func TestPublishAfterClose(t *testing.T) {
	p, err := Listen("tcp://127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := p.Publish(stored(1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Publish after Close = %v, want net.ErrClosed", err)
	}
}
