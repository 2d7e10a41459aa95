package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestPullEnds: a pull's end as Consumer.Fetch reports it from a real
// server: an expiry with nothing to take is no failure; a consumer
// deleted under a waiting pull, or gone before the pull, is one that
// consumerGone tells apart (the pull loop binds it again).
func TestPullEnds(t *testing.T) {
	ctx := t.Context()
	nc, err := nats.Connect(natstest.RunJetStream(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "J", Subjects: []string{"j.>"}})
	if err != nil {
		t.Fatal(err)
	}
	consumer := func(name string) jetstream.Consumer {
		t.Helper()
		c, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		pull func(t *testing.T) error
		want error // nil: the pull ended without a failure
		gone bool
	}{
		{"expired", func(t *testing.T) error {
			b, err := consumer("expired").Fetch(2, jetstream.FetchMaxWait(50*time.Millisecond))
			if err != nil {
				return err
			}
			for range b.Messages() {
				t.Error("a job from an empty queue")
			}
			return b.Error()
		}, nil, false},
		{"deleted while pulling", func(t *testing.T) error {
			c := consumer("deleted")
			b, err := c.Fetch(2, jetstream.FetchMaxWait(10*time.Second))
			if err != nil {
				return err
			}
			testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error {
				if info, err := c.Info(ctx); err != nil || info.NumWaiting != 1 {
					return fmt.Errorf("the pull is not waiting at the server yet (%v)", err)
				}
				return nil
			})
			if err := st.DeleteConsumer(ctx, "deleted"); err != nil {
				t.Fatal(err)
			}
			for range b.Messages() {
				t.Error("a job from an empty queue")
			}
			return b.Error()
		}, jetstream.ErrConsumerDeleted, true},
		{"gone before the pull", func(t *testing.T) error {
			c := consumer("gone")
			if err := st.DeleteConsumer(ctx, "gone"); err != nil {
				t.Fatal(err)
			}
			b, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				return err
			}
			for range b.Messages() {
				t.Error("a job from a deleted consumer")
			}
			return b.Error()
		}, nats.ErrNoResponders, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.pull(t)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) || consumerGone(err) != tc.gone {
				t.Fatalf("pull ended with %v (consumer gone: %v), want %v (%v)", err, consumerGone(err), tc.want, tc.gone)
			}
		})
	}
	if consumerGone(jetstream.ErrConsumerLeadershipChanged) {
		t.Error("a consumer leader change taken for a consumer gone")
	}
}

// TestRanHereForgets: attempts that ran are remembered for dupWindow after
// their end and then forgotten; running ones are not touched.
func TestRanHereForgets(t *testing.T) {
	a := &Agent{running: make(map[attemptKey]time.Time)}
	t0 := time.Now()
	a.running[attemptKey{"now", 0}] = time.Time{} // running
	a.ranHere(attemptKey{"req-1", 0}, t0)
	a.ranHere(attemptKey{"req-2", 0}, t0.Add(dupWindow/2))
	if len(a.running) != 3 {
		t.Fatalf("running %v", a.running)
	}
	a.ranHere(attemptKey{"req-3", 0}, t0.Add(dupWindow))
	if _, ok := a.running[attemptKey{"req-1", 0}]; ok || len(a.running) != 3 || len(a.ranOrder) != 2 {
		t.Fatalf("after dupWindow: running %v, order %v", a.running, a.ranOrder)
	}
	a.ranHere(attemptKey{"req-4", 0}, t0.Add(3*dupWindow))
	if _, ok := a.running[attemptKey{"now", 0}]; !ok || len(a.running) != 2 || len(a.ranOrder) != 1 {
		t.Fatalf("much later: running %v, order %v", a.running, a.ranOrder)
	}
}

// A pull wait is a pull's expiry: zero takes the default, a negative or
// sub-millisecond one is refused by name.
func TestConfigPullWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
		ok   bool
	}{
		{"default", 0, true},
		{"short", 50 * time.Millisecond, true},
		{"negative", -time.Second, false},
		{"below a millisecond", time.Microsecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Config{ID: "a1", Model: "m", PullWait: tc.wait}.Validate()
			if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "pull wait")) {
				t.Fatalf("Validate: %v, want ok %v", err, tc.ok)
			}
		})
	}
}
