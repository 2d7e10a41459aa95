package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// The broker's core, tested where it lives: a real embedded NATS server, a
// real broker, and fake agents that heartbeat, pull jobs from the real
// stream and answer with chunks a test scripts.

const testModel = "m"

type rig struct {
	t  *testing.T
	nc *nats.Conn
	js jetstream.JetStream
	b  *Broker
}

func newRig(t *testing.T, cfg Config, opts ...Option) *rig {
	t.Helper()
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 50 * time.Millisecond
	}
	if cfg.WatchInterval == 0 {
		cfg.WatchInterval = 20 * time.Millisecond
	}
	if cfg.AcceptTimeout == 0 {
		cfg.AcceptTimeout = 200 * time.Millisecond
	}
	cfg.Dispatch.MissedHeartbeats = 3
	b, err := New(nc, cfg, append([]Option{WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		b.jobDeletes.Wait()
	})
	testwait.For(t, 10*time.Second, 10*time.Millisecond, b.Ready)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, nc: nc, js: js, b: b}
}

// fakeAgent heartbeats as ready in one queue and runs script for every job
// it pulls, one at a time per slot.
type fakeAgent struct {
	id, pool, pair string
	slots          int
	state          atomic.Value // string
	pulled         atomic.Int32
	stop           context.CancelFunc
	done           chan struct{}
}

type script func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk))

func (r *rig) agent(id, pool, protocol string, slots int, run script) *fakeAgent {
	r.t.Helper()
	a := &fakeAgent{id: id, pool: pool, slots: slots, done: make(chan struct{})}
	a.state.Store(wire.StateReady)
	b := subjects.Must(subjects.DefaultPrefix)
	hbSubj, _ := b.Heartbeat(testModel, pool, id)
	var filter, name string
	if pool == subjects.PoolRegular {
		filter, _ = b.Jobs(testModel, pool)
		name, _ = subjects.ConsumerName(testModel, pool)
	} else {
		a.pair = subjects.PairKey(protocol, "")
		filter, _ = b.PDJobs(testModel, pool, a.pair)
		name, _ = subjects.PDConsumerName(testModel, pool, a.pair)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.stop = cancel
	readySince := time.Now()
	var active atomic.Int32
	hb := func() {
		h := &wire.Heartbeat{AgentId: id, Model: testModel, Pool: pool, State: a.state.Load().(string), Slots: uint32(slots),
			Active: uint32(active.Load()), Interval: durationpb.New(50 * time.Millisecond), ReadySince: timestamppb.New(readySince)}
		if pool != subjects.PoolRegular {
			h.PdProtocol = protocol
		}
		data, _ := wire.MarshalHeartbeat(h)
		_ = r.nc.Publish(hbSubj, data)
	}
	hb()
	cons, err := r.js.CreateOrUpdateConsumer(ctx, r.b.cfg.Stream, jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy, MaxWaiting: 64,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // heartbeats
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				hb()
			}
		}
	}()
	for range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if a.state.Load() != wire.StateReady {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				batch, err := cons.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
				if err != nil {
					continue
				}
				for msg := range batch.Messages() {
					_ = msg.Ack()
					job := new(wire.Job)
					if proto.Unmarshal(msg.Data(), job) != nil {
						continue
					}
					a.pulled.Add(1)
					active.Add(1)
					var seq uint64
					say := func(c *wire.Chunk) {
						c.RequestId, c.Attempt, c.AgentId, c.Secret = job.GetRequestId(), job.GetAttempt(), id, job.GetSecret()
						if c.GetStage() == wire.Chunk_STAGE_MAIN && (c.Kind == wire.Chunk_KIND_TOKEN || c.Kind == wire.Chunk_KIND_FINAL || c.Kind == wire.Chunk_KIND_ERROR || c.Kind == wire.Chunk_KIND_ACCEPTED) {
							if c.Seq == 0 {
								c.Seq = seq
							}
							seq = c.Seq + 1
						}
						data, _ := wire.AppendFrame([]byte{wire.FrameMarker}, c)
						_ = r.nc.Publish(job.GetReplySubject(), data)
					}
					run(a, job, say)
					active.Add(-1)
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(a.done)
	}()
	r.t.Cleanup(a.Stop)
	return a
}

func (a *fakeAgent) Stop() {
	a.stop()
	<-a.done
}

// token is a token chunk of one event with text.
func token(text string) *wire.Chunk {
	return &wire.Chunk{Kind: wire.Chunk_KIND_TOKEN, Events: []*wire.Event{{Raw: []byte(`{"id":"x","choices":[{"index":0,"delta":{"content":` + fmt.Sprintf("%q", text) + `}}]}`), DeltaText: text}}}
}

func final() *wire.Chunk {
	return &wire.Chunk{Kind: wire.Chunk_KIND_FINAL, FinishReason: "stop", Usage: &wire.Usage{PromptTokens: 3, CompletionTokens: 2, TotalTokens: 5}}
}

// serve answers "a b" and a final chunk.
func serve(_ *fakeAgent, _ *wire.Job, say func(*wire.Chunk)) {
	say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
	say(token(" a"))
	say(token(" b"))
	say(final())
}

// waitEligible waits until the broker's table counts the agents eligible.
func (r *rig) waitEligible(ids ...string) {
	r.t.Helper()
	testwait.For(r.t, 5*time.Second, 10*time.Millisecond, func() error {
		m, ok := r.b.Fleet().Model(testModel)
		if !ok {
			return errors.New("model not in the table")
		}
		elig := map[string]bool{}
		for _, v := range m.Agents() {
			elig[v.ID] = v.Eligible
		}
		for _, id := range ids {
			if !elig[id] {
				return fmt.Errorf("agent %s not eligible", id)
			}
		}
		return nil
	})
}

func body() []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`)
}

// readAll reads a call to its end and returns the text and the final or
// error chunk's kind.
func readAll(t *testing.T, c *Call) (string, error) {
	t.Helper()
	var text strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		ch, err := c.Next(ctx)
		if err != nil {
			return text.String(), err
		}
		switch ch.GetKind() {
		case wire.Chunk_KIND_TOKEN:
			for _, ev := range ch.GetEvents() {
				text.WriteString(ev.GetDeltaText())
			}
		case wire.Chunk_KIND_FINAL:
			return text.String(), nil
		case wire.Chunk_KIND_ERROR:
			return text.String(), ch.GetError()
		}
	}
}

func submit(t *testing.T, b *Broker) *Call {
	t.Helper()
	c, err := b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true, Body: body()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestRetryBeforeFirstToken(t *testing.T) {
	r := newRig(t, Config{})
	bad := r.agent("bad", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ERROR, Error: &wire.Error{Code: wire.CodeEngineDown, Message: "engine gone", Retryable: true}})
		a.state.Store(wire.StateDraining) // take no more
	})
	r.waitEligible("bad")
	c := submit(t, r.b)
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if bad.pulled.Load() == 0 {
			return errors.New("bad agent has not pulled yet")
		}
		return nil
	})
	good := r.agent("good", subjects.PoolRegular, "", 1, serve)
	text, err := readAll(t, c)
	if err != nil || text != " a b" {
		t.Fatalf("got %q, %v", text, err)
	}
	if c.retries != 1 || good.pulled.Load() != 1 {
		t.Fatalf("retries %d, good pulled %d", c.retries, good.pulled.Load())
	}
}

// A first token that takes longer than the stall timeout is not a stall
// while the agent says its engine works on it: the job runs once.
func TestKeepAliveBeforeFirstToken(t *testing.T) {
	r := newRig(t, Config{StallTimeout: 300 * time.Millisecond})
	a := r.agent("slow", subjects.PoolRegular, "", 2, func(_ *fakeAgent, _ *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		for range 10 { // 1s of prefill, keep-alives every 100ms
			time.Sleep(100 * time.Millisecond)
			say(&wire.Chunk{Kind: wire.Chunk_KIND_KEEPALIVE})
		}
		say(token(" a"))
		say(token(" b"))
		say(final())
	})
	r.waitEligible("slow")
	c := submit(t, r.b)
	text, err := readAll(t, c)
	if err != nil || text != " a b" {
		t.Fatalf("got %q, %v", text, err)
	}
	if c.retries != 0 || a.pulled.Load() != 1 {
		t.Fatalf("retries %d, jobs pulled %d: a long prefill was run again", c.retries, a.pulled.Load())
	}
}

// Silence from the agent that holds an attempt, with no keep-alive, is a
// stall: the attempt is retried elsewhere.
func TestStallWithoutKeepAlive(t *testing.T) {
	r := newRig(t, Config{StallTimeout: 300 * time.Millisecond})
	release := make(chan struct{})
	mute := r.agent("mute", subjects.PoolRegular, "", 1, func(a *fakeAgent, _ *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		a.state.Store(wire.StateDraining)
		<-release
	})
	defer close(release)
	r.waitEligible("mute")
	c := submit(t, r.b)
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if mute.pulled.Load() == 0 {
			return errors.New("not pulled yet")
		}
		return nil
	})
	r.agent("good", subjects.PoolRegular, "", 1, serve)
	text, err := readAll(t, c)
	if err != nil || text != " a b" {
		t.Fatalf("got %q, %v", text, err)
	}
	if c.retries != 1 {
		t.Fatalf("retries %d, want 1", c.retries)
	}
}

// A missing chunk after the first token migrates the stream: the new
// attempt carries the text already sent.
func TestSequenceGapMigrates(t *testing.T) {
	r := newRig(t, Config{StallTimeout: 5 * time.Second})
	var conts sync.Map
	r.agent("gappy", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(token(" a"))
		lost := token(" lost")
		lost.Seq = 3 // seq 2 never arrives
		say(lost)
		a.state.Store(wire.StateDraining)
	})
	r.waitEligible("gappy")
	c := submit(t, r.b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got strings.Builder
	for got.String() != " a" {
		ch, err := c.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range ch.GetEvents() {
			got.WriteString(ev.GetDeltaText())
		}
	}
	r.agent("good", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		conts.Store(job.GetAttempt(), job.GetContinuation().GetText())
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(token(" b"))
		say(final())
	})
	text, err := readAll(t, c)
	if err != nil || got.String()+text != " a b" {
		t.Fatalf("got %q + %q, %v", got.String(), text, err)
	}
	if c.migrations != 1 {
		t.Fatalf("migrations %d", c.migrations)
	}
	if v, _ := conts.Load(uint32(1)); v != " a" {
		t.Fatalf("continuation of attempt 1 = %v, want %q", v, " a")
	}
}

// streamMsgs counts the jobs in the stream.
func (r *rig) streamMsgs() uint64 {
	st, err := r.js.Stream(context.Background(), r.b.cfg.Stream)
	if err != nil {
		r.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	return info.State.Msgs
}

// heartbeatOnly makes an agent that says it is ready and pulls nothing.
func (r *rig) heartbeatOnly(id string, slots int) {
	hbSubj, _ := subjects.Must(subjects.DefaultPrefix).Heartbeat(testModel, subjects.PoolRegular, id)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			h := &wire.Heartbeat{AgentId: id, Model: testModel, Pool: subjects.PoolRegular, State: wire.StateReady, Slots: uint32(slots),
				Interval: durationpb.New(50 * time.Millisecond)}
			data, _ := wire.MarshalHeartbeat(h)
			_ = r.nc.Publish(hbSubj, data)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	r.t.Cleanup(func() { cancel(); <-done })
}

// A cancelled or timed-out request's queued job leaves the stream, so an
// agent that starts later never runs it, and the queue counts live
// requests only.
func TestAbandonedJobLeavesQueue(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, c *Call)
	}{
		{"client cancel", func(t *testing.T, c *Call) { c.Close() }},
		{"queue timeout", func(t *testing.T, c *Call) {
			if _, err := readAll(t, c); !errors.Is(err, ErrQueueTimeout) {
				t.Fatalf("err %v, want queue timeout", err)
			}
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{QueueTimeout: 300 * time.Millisecond})
			r.heartbeatOnly("idle", 1)
			r.waitEligible("idle")
			c := submit(t, r.b)
			if n := r.streamMsgs(); n != 1 {
				t.Fatalf("%d jobs queued, want 1", n)
			}
			tc.end(t, c)
			testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
				if n := r.streamMsgs(); n != 0 {
					return fmt.Errorf("%d jobs still queued", n)
				}
				return nil
			})
			late := r.agent("late", subjects.PoolRegular, "", 1, serve)
			r.waitEligible("late")
			if n := late.pulled.Load(); n != 0 {
				t.Fatalf("a late agent ran %d abandoned jobs", n)
			}
			if p, a := r.b.InFlight(testModel).Outstanding(dispatch.PoolRegular, ""); p != 0 || a != 0 {
				t.Fatalf("in flight after the end: pending %d, active %d", p, a)
			}
		})
	}
}

// A PD attempt whose hand-off no decode agent takes within KVHold is
// abandoned and retried (here on regular, the only route left), and the
// prefill leg is not run twice.
func TestHandoffExpires(t *testing.T) {
	r := newRig(t, Config{KVHold: 400 * time.Millisecond, StallTimeout: 200 * time.Millisecond})
	var prefills atomic.Int32
	pre := r.agent("p", subjects.PoolPrefill, "vllm", 1, func(a *fakeAgent, _ *wire.Job, say func(*wire.Chunk)) {
		prefills.Add(1)
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED, Stage: wire.Chunk_STAGE_PREFILL})
		say(&wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Stage: wire.Chunk_STAGE_PREFILL}) // handed off
	})
	// A decode agent that is ready but never pulls its hand-offs.
	dec := r.agent("d", subjects.PoolDecode, "vllm", 1, serve)
	r.waitEligible("p", "d")
	dec.Stop() // its heartbeats stop too: give it a fresh one through a stand-in
	hbSubj, _ := subjects.Must(subjects.DefaultPrefix).Heartbeat(testModel, subjects.PoolDecode, "d")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			data, _ := wire.MarshalHeartbeat(&wire.Heartbeat{AgentId: "d", Model: testModel, Pool: subjects.PoolDecode, State: wire.StateReady, Slots: 1, PdProtocol: "vllm", Interval: durationpb.New(50 * time.Millisecond)})
			_ = r.nc.Publish(hbSubj, data)
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	c := submit(t, r.b)
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if prefills.Load() == 0 {
			return errors.New("no prefill yet")
		}
		return nil
	})
	pre.state.Store(wire.StateDraining)
	r.agent("r", subjects.PoolRegular, "", 1, serve)
	text, err := readAll(t, c)
	if err != nil || text != " a b" {
		t.Fatalf("got %q, %v", text, err)
	}
	if c.retries != 1 || prefills.Load() != 1 {
		t.Fatalf("retries %d, prefills %d", c.retries, prefills.Load())
	}
}

// A model whose only agent is warming is refused at once (503), or waits
// with CapacityWait until the agent is ready; nothing waits in a queue
// that nobody pulls.
func TestCapacityWait(t *testing.T) {
	t.Run("refused at once", func(t *testing.T) {
		r := newRig(t, Config{})
		a := r.agent("w", subjects.PoolRegular, "", 1, serve)
		r.waitEligible("w")
		a.state.Store(wire.StateWarming)
		testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
			if m, _ := r.b.Fleet().Model(testModel); m.Eligible(dispatch.RouteRegular) {
				return errors.New("still eligible")
			}
			return nil
		})
		_, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: true, Body: body()})
		if !errors.Is(err, ErrNoCapacity) {
			t.Fatalf("err %v, want ErrNoCapacity", err)
		}
		if n := r.streamMsgs(); n != 0 {
			t.Fatalf("%d jobs queued for a model nobody serves", n)
		}
	})
	t.Run("waits for the first ready agent", func(t *testing.T) {
		r := newRig(t, Config{CapacityWait: 10 * time.Second})
		a := r.agent("w", subjects.PoolRegular, "", 1, serve)
		a.state.Store(wire.StateWarming)
		testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
			if m, ok := r.b.Fleet().Model(testModel); !ok || m.Eligible(dispatch.RouteRegular) {
				return errors.New("model not known as warming yet")
			}
			return nil
		})
		go func() {
			time.Sleep(300 * time.Millisecond) // an engine that finishes loading
			a.state.Store(wire.StateReady)
		}()
		c := submit(t, r.b)
		if text, err := readAll(t, c); err != nil || text != " a b" {
			t.Fatalf("got %q, %v", text, err)
		}
	})
}

// TestSilenceAfterReconnectMigrates: a stream whose last chunks (its final
// among them) died with the NATS node the broker was connected to shows no
// gap; once the broker has reconnected and the attempt stays silent for
// reconnectSilence it is migrated, long before the stall timeout.
func TestSilenceAfterReconnectMigrates(t *testing.T) {
	r := newRig(t, Config{StallTimeout: time.Minute})
	r.agent("cut", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(token(" a"))
		a.state.Store(wire.StateDraining) // its " b" and final were lost
	})
	r.waitEligible("cut")
	c := submit(t, r.b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got strings.Builder
	for got.String() != " a" {
		ch, err := c.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range ch.GetEvents() {
			got.WriteString(ev.GetDeltaText())
		}
	}
	r.agent("good", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(token(" b"))
		say(final())
	})
	r.waitEligible("good")
	r.b.reconnected.Store(time.Now().UnixNano()) // as watchDeaf does when the connection comes back
	start := time.Now()
	text, err := readAll(t, c)
	if err != nil || got.String()+text != " a b" {
		t.Fatalf("got %q + %q, %v", got.String(), text, err)
	}
	if waited := time.Since(start); waited < reconnectSilence || waited > reconnectSilence+5*time.Second {
		t.Fatalf("migrated %s after the reconnect, want about %s", waited, reconnectSilence)
	}
	if c.migrations != 1 || c.repairs != 1 {
		t.Fatalf("migrations %d, repairs %d: want one migration for chunks lost in transit", c.migrations, c.repairs)
	}
}

// TestLostDeliveryRetried: a job delivered to a pull whose agent never got
// it (the delivery went through a NATS node that died) stays in the
// stream, unacked, until its AckWait; the broker sees its consumer
// delivered it, and retries well before that.
func TestLostDeliveryRetried(t *testing.T) {
	r := newRig(t, Config{StallTimeout: time.Minute})
	r.heartbeatOnly("ghost", 1) // the route is eligible
	r.waitEligible("ghost")
	filter, _ := subjects.Must(subjects.DefaultPrefix).Jobs(testModel, subjects.PoolRegular)
	name, _ := subjects.ConsumerName(testModel, subjects.PoolRegular)
	cons, err := r.js.CreateOrUpdateConsumer(context.Background(), r.b.cfg.Stream, jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxWaiting: 64,
	})
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan struct{})
	go func() { // the pull that takes the job and is never heard of again
		defer close(lost)
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err == nil {
			for range batch.Messages() {
			}
		}
	}()
	testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error { // the pull waits at the server
		info, err := cons.Info(context.Background())
		if err != nil {
			return err
		}
		if info.NumWaiting == 0 {
			return errors.New("no pull waiting at the server")
		}
		return nil
	})
	c := submit(t, r.b)
	<-lost
	r.agent("good", subjects.PoolRegular, "", 1, serve)
	start := time.Now()
	text, err := readAll(t, c)
	if err != nil || text != " a b" {
		t.Fatalf("got %q, %v", text, err)
	}
	if c.retries != 1 {
		t.Fatalf("retries %d, want 1", c.retries)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("served %s after the lost delivery: not before its AckWait", waited)
	}
}

// A retry that finds no serving agent at that instant (the one it leaves
// went out of service, its replacement is not heard yet) waits for one,
// three heartbeat intervals at least, instead of failing an accepted
// request with 503.
func TestRetryWaitsForCapacity(t *testing.T) {
	r := newRig(t, Config{HeartbeatInterval: 500 * time.Millisecond})
	failed := make(chan struct{})
	r.agent("sick", subjects.PoolRegular, "", 1, func(a *fakeAgent, _ *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		a.state.Store(wire.StateDraining)
		// Its draining heartbeat reaches the table: no agent serves.
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if m, ok := r.b.table.Load().Model(testModel); !ok || !m.Eligible(dispatch.RouteRegular) {
				break
			}
		}
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ERROR, Error: &wire.Error{Code: wire.CodeEngineDown, Message: "engine gone", Retryable: true}})
		close(failed)
	})
	r.waitEligible("sick")
	c := submit(t, r.b)
	type result struct {
		text string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		text, err := readAll(t, c)
		done <- result{text, err}
	}()
	<-failed
	r.agent("good", subjects.PoolRegular, "", 1, serve)
	res := <-done
	if text, err := res.text, res.err; err != nil || text != " a b" {
		t.Fatalf("got %q, %v", text, err)
	}
	if c.retries != 1 {
		t.Fatalf("retries %d, want 1", c.retries)
	}
}

// A job an agent took, whose accepted chunk is late, is not retried when
// its route goes out of service meanwhile: it would run twice (a prefill
// twice, on the PD route).
func TestTakenJobNotRetriedWhenRouteEmpties(t *testing.T) {
	r := newRig(t, Config{HeartbeatInterval: time.Second})
	a := r.agent("slow", subjects.PoolRegular, "", 1, func(a *fakeAgent, _ *wire.Job, say func(*wire.Chunk)) {
		took := time.Now()
		a.state.Store(wire.StateDraining)
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if m, ok := r.b.table.Load().Model(testModel); !ok || !m.Eligible(dispatch.RouteRegular) {
				break
			}
		}
		// Past the accept timeout, with the route empty: the broker looks.
		time.Sleep(time.Until(took.Add(3 * r.b.cfg.AcceptTimeout)))
		serve(a, nil, say)
	})
	r.waitEligible("slow")
	c := submit(t, r.b)
	text, err := readAll(t, c)
	if err != nil || text != " a b" {
		t.Fatalf("got %q, %v", text, err)
	}
	if c.retries != 0 || a.pulled.Load() != 1 {
		t.Fatalf("retries %d, jobs pulled %d: a taken job was retried", c.retries, a.pulled.Load())
	}
}

// Every request of a broker shares its reply subject, so a chunk must
// bring back its attempt's secret: a forged one (right request id, attempt
// and sequence number, no secret) is dropped and counted, and the real
// stream goes on untouched.
func TestForgedChunkDropped(t *testing.T) {
	r := newRig(t, Config{StallTimeout: 5 * time.Second})
	r.agent("honest", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		for _, secret := range []uint64{0, job.GetSecret() ^ 1} {
			forged := token(" forged")
			forged.RequestId, forged.Attempt, forged.Seq, forged.AgentId, forged.Secret = job.GetRequestId(), job.GetAttempt(), 1, "honest", secret
			data, _ := wire.AppendFrame([]byte{wire.FrameMarker}, forged)
			_ = r.nc.Publish(job.GetReplySubject(), data)
		}
		say(token(" a"))
		say(final())
	})
	r.waitEligible("honest")
	c := submit(t, r.b)
	text, err := readAll(t, c)
	if err != nil || text != " a" {
		t.Fatalf("got %q, %v", text, err)
	}
	var m dto.Metric
	if err := r.b.metrics.droppedChunks.WithLabelValues("bad_secret").Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 2 {
		t.Fatalf("dropped %v forged chunks, want 2", n)
	}
}

// A chunk for a request this broker no longer holds makes it cancel that
// request again (an agent still running it for nobody), but only for ids
// it issued: its reply subject takes chunks from any agent, and a chunk
// naming another broker's request must not cancel it.
func TestOrphanCancelOnlyOwnRequests(t *testing.T) {
	r := newRig(t, Config{})
	cancels := make(chan *nats.Msg, 8)
	sub, err := r.nc.ChanSubscribe(subjects.Must(subjects.DefaultPrefix).CancelAll(), cancels)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	send := func(id string) {
		data, err := wire.AppendFrame([]byte{wire.FrameMarker}, &wire.Chunk{RequestId: id, Kind: wire.Chunk_KIND_FINAL, Secret: 7})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.nc.Publish(r.b.replyChunks, data); err != nil {
			t.Fatal(err)
		}
	}
	send("another-broker-1x")
	own := r.b.cfg.ID + "-zz"
	send(own)
	select {
	case m := <-cancels:
		if id, err := subjects.Must(subjects.DefaultPrefix).ParseCancel(m.Subject); err != nil || id != own {
			t.Fatalf("cancel of %q (%v), want only %q", id, err, own)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no cancel for the broker's own finished request")
	}
	select {
	case m := <-cancels:
		t.Fatalf("a second cancel: %s", m.Subject)
	case <-time.After(200 * time.Millisecond):
	}
}

// frameSize is the encoded size of chunk as a reply frame carries it.
func frameSize(t *testing.T, chunk *wire.Chunk) int {
	t.Helper()
	data, err := wire.AppendChunk(nil, chunk)
	if err != nil {
		t.Fatal(err)
	}
	return len(data)
}

// A reader that leaves more than BufferBytes waiting is failed with
// ErrSlowReader, after the chunks queued before the failure: the bound on
// a slow client's memory, and its end.
func TestSlowReaderFails(t *testing.T) {
	const buffered = 4
	tok := token(" w")
	tok.RequestId, tok.AgentId, tok.Attempt, tok.Secret, tok.Seq = "broker-request-id", "fast", 1, 1<<60, 100
	cost := queuedCost(frameSize(t, tok), tok)
	r := newRig(t, Config{BufferBytes: buffered*cost + cost/2, StallTimeout: 5 * time.Second})
	sent := make(chan struct{})
	r.agent("fast", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		for range 3 * buffered {
			say(token(" w"))
		}
		close(sent)
	})
	r.waitEligible("fast")
	c := submit(t, r.b)
	<-sent
	testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.failErr == nil {
			return errors.New("not failed yet")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got int
	for {
		_, err := c.Next(ctx)
		if err != nil {
			if !errors.Is(err, ErrSlowReader) {
				t.Fatalf("Next: %v, want ErrSlowReader", err)
			}
			break
		}
		got++
	}
	// The accepted chunk, then the tokens that fit.
	if got < buffered || got > buffered+1 {
		t.Fatalf("read %d chunks before the failure, want the %d or so queued", got, buffered)
	}
	c.Close()
}

// An answer past MaxAnswerBytes ends its call with ErrAnswerTooLarge once
// the client has what came before, whether it reads as a stream or whole,
// and its attempt is cancelled at its agent, which frees the engine's slot.
func TestAnswerTooLarge(t *testing.T) {
	const limit = 64 << 10
	r := newRig(t, Config{MaxAnswerBytes: limit, StallTimeout: 5 * time.Second})
	big := strings.Repeat("x", 4<<10)
	r.agent("chatty", subjects.PoolRegular, "", 2, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		for range 64 {
			say(token(big))
		}
		say(final())
	})
	r.waitEligible("chatty")
	cancels := make(chan *nats.Msg, 16)
	sub, err := r.nc.ChanSubscribe(subjects.Must(subjects.DefaultPrefix).CancelAll(), cancels)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for _, stream := range []bool{true, false} {
		c, err := r.b.Submit(context.Background(), Request{Model: testModel, API: wire.API_API_CHAT, Stream: stream, Body: body()})
		if err != nil {
			t.Fatal(err)
		}
		text, err := readAll(t, c)
		if !errors.Is(err, ErrAnswerTooLarge) {
			t.Fatalf("stream %v: read %d bytes, then %v; want ErrAnswerTooLarge", stream, len(text), err)
		}
		if len(text) > limit || len(text) < limit/2 {
			t.Fatalf("stream %v: %d bytes of text before the error, want up to the %d bound", stream, len(text), limit)
		}
		c.SetOutcome(OutcomeError)
		c.Close()
		// (Cancels of the request before, whose agent still speaks, may
		// come first.)
		for cancelled := false; !cancelled; {
			select {
			case m := <-cancels:
				id, _ := subjects.Must(subjects.DefaultPrefix).ParseCancel(m.Subject)
				cancelled = id == c.ID
			case <-time.After(5 * time.Second):
				t.Fatalf("stream %v: no cancel for the request", stream)
			}
		}
	}
}
