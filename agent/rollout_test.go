package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// Tests of the agent's rollout side: pairing, state reason, slow start,
// keep-alives, hand-off expiry, decode-job publishing and PD-safe cancel.

// env is an embedded NATS server with the jobs stream, as a broker makes it.
type env struct {
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
}

func newEnv(t *testing.T, bcfg broker.Config) *env {
	t.Helper()
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if bcfg.Stream != "-" {
		b, err := broker.New(nc, bcfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.EnsureStream(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{url: s.ClientURL(), nc: nc, js: js}
}

// run starts an agent on its own connection; it drains at cleanup.
func (e *env) run(t *testing.T, eng agent.Engine, cfg agent.Config) *agent.Agent {
	t.Helper()
	anc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(anc.Close)
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 50 * time.Millisecond
	}
	if cfg.PullWait == 0 {
		cfg.PullWait = 200 * time.Millisecond
	}
	if cfg.HandoffGrace == 0 {
		cfg.HandoffGrace = 10 * time.Millisecond // no decode leg waits at cleanup
	}
	a, err := agent.New(anc, eng, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent %s returned %v", cfg.ID, err)
		}
	})
	return a
}

func waitReady(t *testing.T, agents ...*agent.Agent) {
	t.Helper()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		for _, a := range agents {
			if a.State() != wire.StateReady {
				return fmt.Errorf("agent %s is %s (%s)", a.ID(), a.State(), a.StateReason())
			}
		}
		return nil
	})
}

// replies subscribes to a fresh reply subject for request id.
func (e *env) replies(t *testing.T, id string) (string, *nats.Subscription) {
	t.Helper()
	reply := "sy.reply.test." + id
	sub, err := e.nc.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	return reply, sub
}

// publishJob publishes job (its reply subject set) to subject.
func (e *env) publishJob(t *testing.T, subject string, job *wire.Job) {
	t.Helper()
	if job.Model == "" {
		job.Model = "m"
	}
	if job.Api == wire.API_API_UNSPECIFIED {
		job.Api = wire.API_API_CHAT
	}
	if job.Body == nil {
		job.Body = []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`)
	}
	if job.Deadline == nil {
		job.Deadline = timestamppb.New(time.Now().Add(time.Minute))
	}
	data, err := proto.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
}

func (e *env) cancel(t *testing.T, id string) {
	t.Helper()
	if err := e.nc.Publish("sy.cancel."+id, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// nextChunk returns the next chunk on sub, failing after 10s.
func nextChunk(t *testing.T, sub *nats.Subscription) *wire.Chunk {
	t.Helper()
	return next(t, sub)
}

// pending decodes the chunks already waiting on sub.
func pending(t *testing.T, sub *nats.Subscription) []*wire.Chunk {
	t.Helper()
	var out []*wire.Chunk
	for {
		c, err := nextFramed(t, sub, time.Millisecond)
		if errors.Is(err, nats.ErrTimeout) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// healthEngine answers health checks with err until it is cleared.
type healthEngine struct {
	countingEngine
	mu  sync.Mutex
	err error
}

func (e *healthEngine) Health(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// TestStateReason: while the engine is not healthy the heartbeat says
// warming and why; once it is, ready with no reason and a pull limit.
func TestStateReason(t *testing.T) {
	e := newEnv(t, broker.Config{})
	eng := &healthEngine{err: errors.New("HTTP 503: loading weights")}
	hbs, err := e.nc.SubscribeSync("sy.hb.m.regular.w1")
	if err != nil {
		t.Fatal(err)
	}
	a := e.run(t, eng, agent.Config{ID: "w1", Slots: 4})
	const want = "engine not healthy yet: HTTP 503: loading weights"
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		m, err := hbs.NextMsg(5 * time.Second)
		if err != nil {
			return err
		}
		hb, err := wire.UnmarshalHeartbeat(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if hb.GetState() != wire.StateWarming || hb.GetStateReason() != want || hb.GetPullLimit() != 0 {
			return fmt.Errorf("heartbeat state %q reason %q pull limit %d", hb.GetState(), hb.GetStateReason(), hb.GetPullLimit())
		}
		return nil
	})
	eng.mu.Lock()
	eng.err = nil
	eng.mu.Unlock()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		m, err := hbs.NextMsg(5 * time.Second)
		if err != nil {
			return err
		}
		hb, _ := wire.UnmarshalHeartbeat(m.Data)
		if hb.GetState() != wire.StateReady || hb.GetStateReason() != "" || hb.GetPullLimit() != 4 {
			return fmt.Errorf("heartbeat state %q reason %q pull limit %d", hb.GetState(), hb.GetStateReason(), hb.GetPullLimit())
		}
		return nil
	})
	if a.StateReason() != "" {
		t.Fatalf("ready agent's reason %q", a.StateReason())
	}
}

// gateEngine holds every request until its gate opens, recording the most
// requests it ran at once and any moment it ran more than the agent's
// pull limit allowed.
type gateEngine struct {
	gate      chan struct{}
	a         atomic.Pointer[agent.Agent]
	now, peak atomic.Int32
	calls     atomic.Int32
	minLimit  atomic.Int32
	over      atomic.Value // string: the first violation
}

func (e *gateEngine) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	e.calls.Add(1)
	n := e.now.Add(1)
	defer e.now.Add(-1)
	if a := e.a.Load(); a != nil {
		// The limit only grows while the agent serves, so a job running
		// now was taken within a limit no larger than this one.
		lim := int32(a.PullLimit())
		if n > lim {
			e.over.CompareAndSwap(nil, fmt.Sprintf("%d jobs at the engine with a pull limit of %d", n, lim))
		}
		for m := e.minLimit.Load(); lim < m && !e.minLimit.CompareAndSwap(m, lim); m = e.minLimit.Load() {
		}
	}
	for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
	}
	select {
	case <-e.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := emit([]byte(`{"id":"x","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":"stop"}]}`), false); err != nil {
		return err
	}
	return emit([]byte(`{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`), false)
}

// TestSlowStartBoundsHeld: an agent with 8 slots ramping over its slow
// start holds no more jobs than its pull limit while 20 wait, reports the
// limit in its heartbeats, and holds all 8 once the ramp ends.
func TestSlowStartBoundsHeld(t *testing.T) {
	e := newEnv(t, broker.Config{})
	eng := &gateEngine{gate: make(chan struct{})}
	eng.minLimit.Store(1 << 20)
	hbs, err := e.nc.SubscribeSync("sy.hb.m.regular.ramp")
	if err != nil {
		t.Fatal(err)
	}
	a := e.run(t, eng, agent.Config{ID: "ramp", Slots: 8, SlowStart: 3 * time.Second, SlowStartFloor: 0.1})
	eng.a.Store(a)
	var subs []*nats.Subscription
	for i := range 20 {
		id := fmt.Sprintf("r%d", i)
		reply, sub := e.replies(t, id)
		subs = append(subs, sub)
		e.publishJob(t, "sy.jobs.m.regular", &wire.Job{RequestId: id, ReplySubject: reply})
	}
	waitReady(t, a)
	testwait.For(t, 20*time.Second, 5*time.Millisecond, func() error {
		if over, _ := eng.over.Load().(string); over != "" {
			t.Fatal(over)
		}
		if n := eng.now.Load(); n != 8 || a.Active() != 8 {
			return fmt.Errorf("%d jobs at the engine, %d held, pull limit %d; want 8 once the ramp ends", n, a.Active(), a.PullLimit())
		}
		return nil
	})
	if m := eng.minLimit.Load(); m >= 8 {
		t.Fatalf("the first jobs ran with a pull limit of %d: no ramp", m)
	}
	// The heartbeats told the broker the limit as it grew: read them until
	// one reports the full limit (the agent reached it before saying so).
	var limits []uint32
	for len(limits) == 0 || limits[len(limits)-1] != 8 {
		m, err := hbs.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("heartbeat pull limits %v, then: %v", limits, err)
		}
		hb, _ := wire.UnmarshalHeartbeat(m.Data)
		if hb.GetState() == wire.StateReady {
			limits = append(limits, hb.GetPullLimit())
		}
	}
	if len(limits) < 2 || limits[0] >= 8 || limits[len(limits)-1] != 8 {
		t.Fatalf("heartbeat pull limits %v: want growing to 8", limits)
	}
	for i := 1; i < len(limits); i++ {
		if limits[i] < limits[i-1] {
			t.Fatalf("pull limit fell: %v", limits)
		}
	}
	close(eng.gate)
	for _, sub := range subs {
		for c := nextChunk(t, sub); c.GetKind() != wire.Chunk_KIND_FINAL; c = nextChunk(t, sub) {
		}
	}
	if p := eng.peak.Load(); p != 8 {
		t.Fatalf("peak %d, want 8", p)
	}
}

// TestKeepalive: while the engine has not produced its first token the
// agent sends keep-alives outside the sequence; none after the first token.
func TestKeepalive(t *testing.T) {
	tests := []struct {
		name      string
		keepalive time.Duration
		want      bool
	}{
		{"on", 20 * time.Millisecond, true},
		{"off", -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, broker.Config{})
			eng := &countingEngine{delay: 300 * time.Millisecond} // a slow first token
			a := e.run(t, eng, agent.Config{ID: "ka", Slots: 1, Keepalive: tc.keepalive})
			waitReady(t, a)
			reply, sub := e.replies(t, "k1")
			e.publishJob(t, "sy.jobs.m.regular", &wire.Job{RequestId: "k1", ReplySubject: reply})
			var kinds []wire.Chunk_Kind
			keepalives, seq := 0, uint64(0)
			for {
				c := nextChunk(t, sub)
				kinds = append(kinds, c.GetKind())
				if c.GetKind() == wire.Chunk_KIND_KEEPALIVE {
					keepalives++
					if len(kinds) == 1 || c.GetSeq() != 0 || c.GetAgentId() != "ka" || c.GetStage() != wire.Chunk_STAGE_MAIN {
						t.Fatalf("keep-alive %v after %v: want seq 0 (accepted's), after accepted", c, kinds)
					}
					if slicesContain(kinds, wire.Chunk_KIND_TOKEN) {
						t.Fatalf("keep-alive after the first token: %v", kinds)
					}
					continue
				}
				if c.GetSeq() != seq {
					t.Fatalf("chunk %v has seq %d, want %d: keep-alives must not advance the sequence", c.GetKind(), c.GetSeq(), seq)
				}
				seq++
				if c.GetKind() == wire.Chunk_KIND_FINAL {
					break
				}
			}
			if got := keepalives > 0; got != tc.want {
				t.Fatalf("%d keep-alives (%v), want some: %v", keepalives, kinds, tc.want)
			}
			// Nothing more once the stream ended.
			if rest := pending(t, sub); len(rest) > 0 {
				t.Fatalf("chunks after the final: %v", rest)
			}
		})
	}
}

func slicesContain(s []wire.Chunk_Kind, k wire.Chunk_Kind) bool {
	for _, x := range s {
		if x == k {
			return true
		}
	}
	return false
}

// TestConfigPDLabels: labels are canonicalised into the heartbeat, and bad
// ones refused.
func TestConfigPDLabels(t *testing.T) {
	tests := []struct {
		name, labels, want string
		ok                 bool
	}{
		{"none", "", "", true},
		{"sorted", " v=0.11 , kv=nixl", "kv=nixl,v=0.11", true},
		{"no value", "kv=", "", false},
		{"twice", "kv=a,kv=b", "", false},
		{"no equals", "nixl", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := agent.New(&nats.Conn{}, &countingEngine{}, agent.Config{ID: "p", Model: "m", Pool: subjects.PoolDecode, PDProtocol: "vllm", PDLabels: tc.labels})
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "pd labels") {
					t.Fatalf("error %q does not name the labels", err)
				}
				return
			}
			if hb := a.Heartbeat(); hb.GetPdLabels() != tc.want || hb.GetPdProtocol() != "vllm" {
				t.Fatalf("heartbeat labels %q protocol %q, want %q", hb.GetPdLabels(), hb.GetPdProtocol(), tc.want)
			}
		})
	}
}
