package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// The race of an offer's move (docs/affinity.md): the offered agent has
// received the directed job but not yet said so when the broker's wait
// ends; the broker deletes it (JetStream deletes a delivered, unacked
// message, and acks it afterwards without complaint) and publishes it to
// the shared queue, where another agent takes it. Both run the attempt.
// Reproduced here step by step: the offered agent is the test, which
// holds the directed message until the shared copy was taken.

// cancelLog records the cancels the broker publishes.
type cancelLog struct {
	mu   sync.Mutex
	msgs []string // "<request> <payload>"
}

func (r *rig) cancels() *cancelLog {
	l := &cancelLog{}
	sub, err := r.nc.Subscribe("sy.cancel.*", func(m *nats.Msg) {
		id, _ := subjects.Must(subjects.DefaultPrefix).ParseCancel(m.Subject)
		l.mu.Lock()
		l.msgs = append(l.msgs, id+" "+string(m.Data))
		l.mu.Unlock()
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// waitFor waits for a cancel of request id that stops agent (named by
// it, or stopping every agent) and returns it.
func (l *cancelLog) waitFor(t *testing.T, id, agent string) string {
	t.Helper()
	var got string
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, m := range l.msgs {
			rid, payload, _ := strings.Cut(m, " ")
			if rid != id {
				continue
			}
			if _, to, err := wire.ParseCancel([]byte(payload)); err == nil && (to == agent || to == "") {
				got = m
				return nil
			}
		}
		return fmt.Errorf("no cancel of %s at %s among %q", id, agent, l.msgs)
	})
	return got
}

func (l *cancelLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// longBody is a prompt long enough for block keys.
func longBody() []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("many words of a long prompt ", 20) + `"}],"max_tokens":8,"stream":true}`)
}

// directedHold is the offered agent "slow", played by the test: it
// heartbeats ready and pulls its directed queue by hand.
func (r *rig) directedHold(pool, pair, id string) jetstream.Consumer {
	r.t.Helper()
	filter, err := subjects.Must(subjects.DefaultPrefix).Directed(testModel, pool, pair, id)
	if err != nil {
		r.t.Fatal(err)
	}
	name, _ := subjects.DirectedConsumerName(testModel, pool, pair, id)
	cons, err := r.js.CreateOrUpdateConsumer(context.Background(), subjects.DirectedStream(r.b.cfg.Stream), jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return cons
}

// fetchOne pulls one message of cons, unacked.
func fetchOne(t *testing.T, cons jetstream.Consumer) (jetstream.Msg, *wire.Job) {
	t.Helper()
	var msg jetstream.Msg
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			msg = m
		}
		if msg == nil {
			return errors.New("no directed job yet")
		}
		return nil
	})
	job := new(wire.Job)
	if err := proto.Unmarshal(msg.Data(), job); err != nil {
		t.Fatal(err)
	}
	return msg, job
}

// sayAs publishes chunks for job as agent, numbering its main-stage
// chunks from 0.
func (r *rig) sayAs(agent string, job *wire.Job) func(*wire.Chunk) {
	var seq uint64
	return func(c *wire.Chunk) {
		c.RequestId, c.Attempt, c.AgentId, c.Secret = job.GetRequestId(), job.GetAttempt(), agent, job.GetSecret()
		if c.GetStage() == wire.Chunk_STAGE_MAIN && c.Kind != wire.Chunk_KIND_KEEPALIVE {
			c.Seq = seq
			seq++
		}
		data, _ := wire.AppendFrame([]byte{wire.FrameMarker}, c)
		_ = r.nc.Publish(job.GetReplySubject(), data)
	}
}

// TestOfferMoveRace: both agents of a moved offer run the attempt. The
// one that spoke first is relayed and the other is cancelled, at it
// alone, as soon as it speaks; the client's stream is one agent's, byte
// for byte.
func TestOfferMoveRace(t *testing.T) {
	for _, first := range []string{"moved", "offered"} {
		t.Run(first+" speaks first", func(t *testing.T) {
			r := newRig(t, Config{Affinity: AffinityConfig{Mode: AffinityApprox, Wait: 50 * time.Millisecond}})
			cancels := r.cancels()
			r.heartbeatOnly("slow", 4)
			held := r.directedHold(subjects.PoolRegular, "", "slow")
			slowSpoke, fastGo := make(chan struct{}), make(chan struct{})
			// Deferred, so a failing test does not leave fast waiting.
			spoke, goOn := sync.OnceFunc(func() { close(slowSpoke) }), sync.OnceFunc(func() { close(fastGo) })
			defer goOn()
			defer spoke()
			fast := r.agent("fast", subjects.PoolRegular, "", 1, func(_ *fakeAgent, _ *wire.Job, say func(*wire.Chunk)) {
				if first == "offered" {
					<-slowSpoke
				}
				say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
				say(token(" a"))
				<-fastGo
				say(token(" b"))
				say(final())
			})
			r.waitEligible("slow", "fast")
			body := longBody()
			r.b.affPool(testModel, subjects.PoolRegular).tree.Insert("slow", oaiformat.PromptKeys(nil, 16, wire.API_API_CHAT, body))
			c, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true, Body: body})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The reader watches the offer: it reads from the start.
			done := readInBackground(t, c)
			// slow receives its offer and is slow to say so: the broker's
			// wait ends, the job moves and fast takes the shared copy.
			msg, job := fetchOne(t, held)
			testwait.For(t, 10*time.Second, time.Millisecond, func() error {
				if fast.pulled.Load() == 0 {
					return errors.New("the offer has not moved to fast yet")
				}
				return nil
			})
			slow := r.sayAs("slow", job)
			if first == "moved" {
				// fast spoke first: slow's accepted must get it cancelled.
				testwait.For(t, 10*time.Second, time.Millisecond, func() error {
					if c.currentSpeaker() != "fast" {
						return errors.New("fast has not spoken yet")
					}
					return nil
				})
				slow(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
				_ = msg.Ack()
				cancels.waitFor(t, c.ID, "slow")
				goOn()
			} else {
				slow(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
				_ = msg.Ack()
				spoke()
				goOn()
				cancels.waitFor(t, c.ID, "fast")
				slow(token(" a"))
				slow(token(" b"))
				slow(final())
			}
			if res := <-done; res.err != nil || res.text != " a b" {
				t.Fatalf("text %q, %v", res.text, res.err)
			}
			winner := map[string]string{"moved": "fast", "offered": "slow"}[first]
			for _, m := range cancels.all() {
				if _, payload, _ := strings.Cut(m, " "); payload != "" {
					if _, to, _ := wire.ParseCancel([]byte(payload)); to == "" || to == winner {
						t.Fatalf("cancel %q stops the relayed agent %s", m, winner)
					}
				}
			}
			if c.retries != 0 {
				t.Fatalf("%d retries: the race is one attempt", c.retries)
			}
			var m dto.Metric
			if err := r.b.metrics.secondRuns.WithLabelValues("main").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
				t.Fatalf("second runs stopped: %v (%v), want 1", m.GetCounter().GetValue(), err)
			}
		})
	}
}

func (c *Call) currentSpeaker() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.speaker
}

// heartbeatIn makes an agent of pool that says it is ready and pulls
// nothing (the test pulls for it).
func (r *rig) heartbeatIn(id, pool, protocol string, slots int) {
	hbSubj, _ := subjects.Must(subjects.DefaultPrefix).Heartbeat(testModel, pool, id)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			data, _ := wire.MarshalHeartbeat(&wire.Heartbeat{AgentId: id, Model: testModel, Pool: pool, State: wire.StateReady, Slots: uint32(slots),
				PdProtocol: protocol, Interval: durationpb.New(50 * time.Millisecond)})
			_ = r.nc.Publish(hbSubj, data)
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	r.t.Cleanup(func() { close(stop); <-done })
}

// TestOfferMoveRacePrefill: the same race on PD's prefill pool. The
// prefill agent that spoke first is the one listened to; the other is
// told to stop when it speaks, and the request's one decode leg is the
// first one's.
func TestOfferMoveRacePrefill(t *testing.T) {
	r := newRig(t, Config{Affinity: AffinityConfig{Mode: AffinityApprox, Wait: 50 * time.Millisecond}})
	cancels := r.cancels()
	pair := subjects.PairKey("vllm", "")
	r.heartbeatIn("slow", subjects.PoolPrefill, "vllm", 4)
	held := r.directedHold(subjects.PoolPrefill, pair, "slow")
	decodeSubj, _ := subjects.Must(subjects.DefaultPrefix).PDJobs(testModel, subjects.PoolDecode, pair)
	fast := r.agent("fast", subjects.PoolPrefill, "vllm", 1, func(_ *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED, Stage: wire.Chunk_STAGE_PREFILL})
		dj := proto.Clone(job).(*wire.Job)
		dj.Pd, dj.PdPair = &wire.PDHandoff{PrefillAgent: "fast", Protocol: "vllm"}, pair
		data, _ := proto.Marshal(dj)
		if _, err := r.js.Publish(context.Background(), decodeSubj, data); err != nil {
			t.Error(err)
		}
		say(&wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Stage: wire.Chunk_STAGE_PREFILL}) // handed off
	})
	dec := r.agent("dec", subjects.PoolDecode, "vllm", 2, serve)
	r.waitEligible("slow", "fast", "dec")
	body := longBody()
	r.b.affPool(testModel, subjects.PoolPrefill).tree.Insert("slow", oaiformat.PromptKeys(nil, 16, wire.API_API_CHAT, body))
	c, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Route != dispatch.RoutePD {
		t.Fatalf("route %s, want pd", c.Route)
	}
	done := readInBackground(t, c)
	msg, job := fetchOne(t, held)
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.prefillSpeaker != "fast" {
			return errors.New("fast has not taken the moved offer and spoken yet")
		}
		return nil
	})
	slow := r.sayAs("slow", job)
	slow(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED, Stage: wire.Chunk_STAGE_PREFILL})
	_ = msg.Ack()
	cancels.waitFor(t, c.ID, "slow")
	if res := <-done; res.err != nil || res.text != " a b" {
		t.Fatalf("text %q, %v", res.text, res.err)
	}
	if fast.pulled.Load() != 1 || dec.pulled.Load() != 1 {
		t.Fatalf("fast pulled %d, dec %d: want one prefill and one decode leg", fast.pulled.Load(), dec.pulled.Load())
	}
	if c.retries != 0 {
		t.Fatalf("%d retries", c.retries)
	}
	var m dto.Metric
	if err := r.b.metrics.secondRuns.WithLabelValues("prefill").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("second prefill runs stopped: %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
}

// readResult is what readAll gave a reader running beside the test.
type readResult struct {
	text string
	err  error
}

// readInBackground reads c to its end beside the test, which goes on
// playing the agents; the result comes on the channel.
func readInBackground(t *testing.T, c *Call) <-chan readResult {
	done := make(chan readResult, 1)
	go func() {
		text, err := readAll(t, c)
		done <- readResult{text, err}
	}()
	return done
}
