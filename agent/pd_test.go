package agent_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/pd"
	"github.com/switchyard-ai/switchyard/agent/engine/sim"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

var subj = subjects.Must(subjects.DefaultPrefix)

// simPD returns an in-process sim engine of role speaking vLLM's PD
// protocol, and the agent's engine for it.
func simPD(t *testing.T, role simengine.Role, ttft, itl time.Duration) (*simengine.Engine, agent.Engine) {
	return simPDProto(t, pd.VLLM, role, ttft, itl)
}

// simPDProto is simPD for either protocol.
func simPDProto(t *testing.T, protocol string, role simengine.Role, ttft, itl time.Duration) (*simengine.Engine, agent.Engine) {
	t.Helper()
	se, err := simengine.New(simengine.Config{Model: "m", TTFT: ttft, ITL: itl, Slots: 4, Role: role, PDProtocol: simengine.PDProtocol(protocol)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = se.Close() })
	var opts []pd.Option
	if protocol == pd.SGLang && role == simengine.RolePrefill {
		opts = append(opts, pd.WithBootstrap(se.BootstrapHost(), se.BootstrapPort()))
	}
	eng, err := pd.New(sim.New(se), protocol, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return se, eng
}

// watchEngine wraps a decode engine and records, per request, whether the
// engine produced a first chunk (so it read the hand-off's KV) and ended.
// A request with a gate waits for it before reaching the engine.
type watchEngine struct {
	inner agent.Engine
	mu    sync.Mutex
	gates map[string]chan struct{}
	runs  map[string]*watchRun
}

type watchRun struct {
	started, firstChunk, ended bool
	err                        error
}

func newWatch(inner agent.Engine) *watchEngine {
	return &watchEngine{inner: inner, gates: map[string]chan struct{}{}, runs: map[string]*watchRun{}}
}

func (w *watchEngine) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	w.mu.Lock()
	run := &watchRun{started: true}
	w.runs[r.RequestID] = run
	gate := w.gates[r.RequestID]
	w.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := w.inner.Stream(ctx, r, func(b []byte, more bool) error {
		w.mu.Lock()
		run.firstChunk = true
		w.mu.Unlock()
		return emit(b, more)
	})
	w.mu.Lock()
	run.ended, run.err = true, err
	w.mu.Unlock()
	return err
}

func (w *watchEngine) run(id string) watchRun {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r := w.runs[id]; r != nil {
		return *r
	}
	return watchRun{}
}

// handoffEngine is a prefill engine that hands off at once.
type handoffEngine struct{ countingEngine }

func (e *handoffEngine) Prefill(_ context.Context, _ *agent.Request, handoff func(*wire.PDHandoff) error) error {
	return handoff(&wire.PDHandoff{Protocol: pd.VLLM, KvTransferParamsJson: []byte(`{"do_remote_prefill":true}`)})
}

const labels = "kv=nixl,v=1"

var pair = subjects.PairKey(pd.VLLM, labels)

func pdSubject(t *testing.T, pool, pair string) string {
	t.Helper()
	s, err := subj.PDJobs("m", pool, pair)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// queued returns how many jobs wait on subject.
func (e *env) queued(t *testing.T, stream, subject string) uint64 {
	t.Helper()
	st, err := e.js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// TestPDPairing: a prefill agent pulls its pairing's queue and hands off to
// the decode agent of the same protocol and labels only, keeping the
// broker informed with prefill-stage keep-alives while its leg runs.
func TestPDPairing(t *testing.T) {
	e := newEnv(t, broker.Config{})
	_, pre := simPD(t, simengine.RolePrefill, 200*time.Millisecond, time.Millisecond)
	_, dec := simPD(t, simengine.RoleDecode, time.Millisecond, time.Millisecond)
	other := &countingEngine{}
	ap := e.run(t, pre, agent.Config{ID: "pre", Pool: subjects.PoolPrefill, PDProtocol: pd.VLLM, PDLabels: " v=1 , kv=nixl", Keepalive: 20 * time.Millisecond})
	ad := e.run(t, dec, agent.Config{ID: "dec", Pool: subjects.PoolDecode, PDProtocol: pd.VLLM, PDLabels: labels})
	ax := e.run(t, other, agent.Config{ID: "dec-x", Pool: subjects.PoolDecode, PDProtocol: pd.VLLM, PDLabels: "kv=mooncake,v=1"})
	waitReady(t, ap, ad, ax)
	if got := ap.Heartbeat().GetPdLabels(); got != labels {
		t.Fatalf("heartbeat labels %q, want %q", got, labels)
	}
	reply, sub := e.replies(t, "p1")
	e.publishJob(t, pdSubject(t, subjects.PoolPrefill, pair), &wire.Job{RequestId: "p1", ReplySubject: reply, PdPair: pair})
	var prefillKinds, decodeKinds []wire.Chunk_Kind
	for {
		c := nextChunk(t, sub)
		if c.GetStage() == wire.Chunk_STAGE_PREFILL {
			if c.GetAgentId() != "pre" {
				t.Fatalf("prefill chunk from %q", c.GetAgentId())
			}
			prefillKinds = append(prefillKinds, c.GetKind())
			continue
		}
		if c.GetAgentId() != "dec" {
			t.Fatalf("decode chunk from %q: %v", c.GetAgentId(), c)
		}
		if c.GetKind() == wire.Chunk_KIND_ACCEPTED && c.GetPrefillAgent() != "pre" {
			t.Fatalf("decode accepted names prefill agent %q", c.GetPrefillAgent())
		}
		decodeKinds = append(decodeKinds, c.GetKind())
		if c.GetKind() == wire.Chunk_KIND_ERROR {
			t.Fatalf("error %v", c.GetError())
		}
		if c.GetKind() == wire.Chunk_KIND_FINAL {
			break
		}
	}
	if len(prefillKinds) < 2 || prefillKinds[0] != wire.Chunk_KIND_ACCEPTED || !slicesContain(prefillKinds, wire.Chunk_KIND_KEEPALIVE) {
		t.Fatalf("prefill stage sent %v, want accepted and keep-alives while its leg ran", prefillKinds)
	}
	if decodeKinds[0] != wire.Chunk_KIND_ACCEPTED || !slicesContain(decodeKinds, wire.Chunk_KIND_TOKEN) {
		t.Fatalf("decode stage sent %v", decodeKinds)
	}
	if n := other.calls.Load(); n != 0 {
		t.Fatalf("the decode agent of other labels ran %d jobs", n)
	}
}

// TestDecodeJobStamped: the decode job goes to the decode queue of the
// prefill agent's own pairing, with its pairing and its KV hold.
func TestDecodeJobStamped(t *testing.T) {
	e := newEnv(t, broker.Config{})
	ap := e.run(t, &handoffEngine{}, agent.Config{ID: "pre", Pool: subjects.PoolPrefill, PDProtocol: pd.VLLM, PDLabels: labels, KVHold: 7 * time.Second})
	waitReady(t, ap)
	reply, _ := e.replies(t, "s1")
	before := time.Now()
	e.publishJob(t, pdSubject(t, subjects.PoolPrefill, pair), &wire.Job{RequestId: "s1", ReplySubject: reply, PdPair: pair})
	decodeSubj := pdSubject(t, subjects.PoolDecode, pair)
	var m *jetstream.RawStreamMsg
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		st, err := e.js.Stream(context.Background(), agent.DefaultStream)
		if err != nil {
			return err
		}
		m, err = st.GetLastMsgForSubject(context.Background(), decodeSubj)
		return err
	})
	after := time.Now()
	dj := new(wire.Job)
	if err := proto.Unmarshal(m.Data, dj); err != nil {
		t.Fatal(err)
	}
	exp := dj.GetHandoffExpires().AsTime()
	if dj.GetPdPair() != pair || dj.GetPd().GetPrefillAgent() != "pre" || exp.Before(before.Add(7*time.Second)) || exp.After(after.Add(7*time.Second)) {
		t.Fatalf("decode job pair %q prefill agent %q expires %v (published between %v and %v, hold 7s)",
			dj.GetPdPair(), dj.GetPd().GetPrefillAgent(), exp, before, after)
	}
}

// TestHandoffExpired: a decode job taken after its hand-off expired is not
// run; the attempt ends with a retryable handoff_expired error.
func TestHandoffExpired(t *testing.T) {
	tests := []struct {
		name    string
		expires time.Duration // from now
		want    wire.Chunk_Kind
	}{
		{"expired", -time.Second, wire.Chunk_KIND_ERROR},
		{"in time", time.Minute, wire.Chunk_KIND_ACCEPTED},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, broker.Config{})
			eng := &countingEngine{}
			ad := e.run(t, eng, agent.Config{ID: "dec", Pool: subjects.PoolDecode, PDProtocol: pd.VLLM})
			waitReady(t, ad)
			reply, sub := e.replies(t, "h1")
			e.publishJob(t, pdSubject(t, subjects.PoolDecode, pd.VLLM), &wire.Job{RequestId: "h1", ReplySubject: reply, PdPair: pd.VLLM,
				Pd:             &wire.PDHandoff{Protocol: pd.VLLM, PrefillAgent: "pre", KvTransferParamsJson: []byte(`{}`)},
				HandoffExpires: timestamppb.New(time.Now().Add(tc.expires))})
			c := nextChunk(t, sub)
			if c.GetKind() != tc.want {
				t.Fatalf("first chunk %v, want %v", c, tc.want)
			}
			if tc.want == wire.Chunk_KIND_ERROR {
				if c.GetError().GetCode() != wire.CodeHandoffExpired || !c.GetError().GetRetryable() {
					t.Fatalf("error %v, want a retryable %s", c.GetError(), wire.CodeHandoffExpired)
				}
				if n := eng.calls.Load(); n != 0 {
					t.Fatalf("engine ran %d expired decode jobs", n)
				}
				return
			}
			for c.GetKind() != wire.Chunk_KIND_FINAL {
				c = nextChunk(t, sub)
			}
		})
	}
}

// TestDecodePublishQueueFull: a full decode queue ends the attempt with a
// retryable queue_full error, not engine_unavailable.
func TestDecodePublishQueueFull(t *testing.T) {
	e := newEnv(t, broker.Config{QueueMax: 1})
	decodeSubj := pdSubject(t, subjects.PoolDecode, pd.VLLM)
	e.publishJob(t, decodeSubj, &wire.Job{RequestId: "filler", ReplySubject: "sy.reply.test.filler"})
	ap := e.run(t, &handoffEngine{}, agent.Config{ID: "pre", Pool: subjects.PoolPrefill, PDProtocol: pd.VLLM})
	waitReady(t, ap)
	reply, sub := e.replies(t, "q1")
	e.publishJob(t, pdSubject(t, subjects.PoolPrefill, pd.VLLM), &wire.Job{RequestId: "q1", ReplySubject: reply})
	for {
		c := nextChunk(t, sub)
		if c.GetStage() != wire.Chunk_STAGE_PREFILL {
			t.Fatalf("chunk outside the prefill stage: %v", c)
		}
		if c.GetKind() == wire.Chunk_KIND_ERROR {
			if c.GetError().GetCode() != wire.CodeQueueFull || !c.GetError().GetRetryable() {
				t.Fatalf("error %v, want a retryable %s", c.GetError(), wire.CodeQueueFull)
			}
			return
		}
	}
}

// TestDecodePublishRetried: a decode queue that does not answer yet (no
// stream holds it) is tried again until it does; the attempt goes on.
func TestDecodePublishRetried(t *testing.T) {
	e := newEnv(t, broker.Config{Stream: "-"})
	cfg := jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"sy.jobs.m.prefill.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage}
	if _, err := e.js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	ap := e.run(t, &handoffEngine{}, agent.Config{ID: "pre", Stream: "JOBS", Pool: subjects.PoolPrefill, PDProtocol: pd.VLLM})
	reg := prometheus.NewRegistry()
	if err := ap.Metrics().Register(reg); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ap)
	reply, sub := e.replies(t, "n1")
	e.publishJob(t, pdSubject(t, subjects.PoolPrefill, pd.VLLM), &wire.Job{RequestId: "n1", ReplySubject: reply})
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := counter(t, reg, "switchyard_agent_decode_publish_retries_total"); n < 2 {
			return fmt.Errorf("%v publish retries", n)
		}
		return nil
	})
	cfg.Subjects = []string{"sy.jobs.>"}
	if _, err := e.js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	decodeSubj := pdSubject(t, subjects.PoolDecode, pd.VLLM)
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := e.queued(t, "JOBS", decodeSubj); n != 1 {
			return fmt.Errorf("%d decode jobs queued", n)
		}
		return nil
	})
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := ap.Active(); n != 0 {
			return fmt.Errorf("%d jobs held", n)
		}
		return nil
	})
	for _, c := range pending(t, sub) {
		if c.GetKind() == wire.Chunk_KIND_ERROR {
			t.Fatalf("the attempt failed: %v", c.GetError())
		}
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// pdPair is a vLLM prefill and decode agent on sim engines.
type pdPair struct {
	proto          string
	e              *env
	pre, dec       *simengine.Engine
	watch          *watchEngine
	prefill, decod *agent.Agent
}

func startPair(t *testing.T, protocol string, prefillTTFT, decodeITL time.Duration, decodeSlots int) *pdPair {
	t.Helper()
	e := newEnv(t, broker.Config{})
	pre, preEng := simPDProto(t, protocol, simengine.RolePrefill, prefillTTFT, time.Millisecond)
	dec, decEng := simPDProto(t, protocol, simengine.RoleDecode, time.Millisecond, decodeITL)
	w := newWatch(decEng)
	ap := e.run(t, preEng, agent.Config{ID: "pre", Pool: subjects.PoolPrefill, PDProtocol: protocol})
	ad := e.run(t, w, agent.Config{ID: "dec", Pool: subjects.PoolDecode, PDProtocol: protocol, Slots: decodeSlots})
	waitReady(t, ap, ad)
	return &pdPair{proto: protocol, e: e, pre: pre, dec: dec, watch: w, prefill: ap, decod: ad}
}

func (p *pdPair) submit(t *testing.T, id string, maxTokens int) *nats.Subscription {
	t.Helper()
	reply, sub := p.e.replies(t, id)
	p.e.publishJob(t, pdSubject(t, subjects.PoolPrefill, p.proto), &wire.Job{RequestId: id, ReplySubject: reply,
		Body: fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":"tell me about %s"}],"max_tokens":%d}`, id, maxTokens)})
	return sub
}

// idle waits for both agents to hold nothing.
func (p *pdPair) idle(t *testing.T) {
	t.Helper()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if p.prefill.Active() != 0 || p.decod.Active() != 0 {
			return fmt.Errorf("prefill holds %d, decode %d", p.prefill.Active(), p.decod.Active())
		}
		return nil
	})
}

// noKVHeld waits for the prefill engine to hold no hand-off's KV: read by
// a decode leg, not left until the hold timeout.
func noKVHeld(t *testing.T, pre *simengine.Engine) {
	t.Helper()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if h, b := pre.HeldKV(); h != 0 || b != 0 {
			return fmt.Errorf("prefill engine holds %d hand-offs, %d KV blocks", h, b)
		}
		return nil
	})
	if n := pre.HandoffsExpired(); n != 0 {
		t.Fatalf("%d hand-offs expired unread", n)
	}
}

// noOutput fails if chunks carry output or an end for the request.
func noOutput(t *testing.T, chunks []*wire.Chunk) {
	t.Helper()
	for _, c := range chunks {
		if c.GetStage() == wire.Chunk_STAGE_PREFILL {
			continue
		}
		switch c.GetKind() {
		case wire.Chunk_KIND_TOKEN, wire.Chunk_KIND_FINAL, wire.Chunk_KIND_ERROR:
			t.Fatalf("a cancelled attempt sent %v", c)
		}
	}
}

// TestPDSafeCancel: a cancel after the hand-off leaves no KV held on the
// prefill engine: the decode leg still takes the hand-off, in silence, and
// then stops. A vLLM prefill leg cancelled before its hand-off runs on,
// and its decode job, marked release, frees the KV the same way.
func TestPDSafeCancel(t *testing.T) {
	for _, protocol := range []string{pd.VLLM, pd.SGLang} {
		t.Run("after hand-off, before the first token/"+protocol, func(t *testing.T) {
			cancelAfterHandoff(t, protocol)
		})
	}
	t.Run("decode job pulled after the cancel", func(t *testing.T) {
		p := startPair(t, pd.VLLM, time.Millisecond, 5*time.Millisecond, 1)
		free := p.occupyDecode(t)
		sub := p.submit(t, "late", 4)
		// The decode agent's one slot is busy: the decode job waits.
		testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
			if n := p.e.queued(t, agent.DefaultStream, pdSubject(t, subjects.PoolDecode, pd.VLLM)); n != 1 {
				return fmt.Errorf("%d decode jobs queued", n)
			}
			return nil
		})
		p.e.cancel(t, "late")
		free()
		p.tookHandoffSilently(t, "late")
		if n := p.dec.KVTransferFailures(); n != 0 {
			t.Fatalf("%d KV transfers failed", n)
		}
		noKVHeld(t, p.pre)
		for _, c := range pending(t, sub) {
			if c.GetStage() != wire.Chunk_STAGE_PREFILL {
				t.Fatalf("the decode leg of a cancelled request spoke: %v", c)
			}
		}
	})

	t.Run("before hand-off/vllm", func(t *testing.T) {
		// The cancel comes while the prefill computes. The agent cannot
		// tell that from an answer already on the wire (after which the
		// engine holds the KV whatever it is told), so the leg runs on and
		// its decode job goes out marked release: a decode agent takes the
		// hand-off, in silence, and nothing stays held.
		p := startPair(t, pd.VLLM, 300*time.Millisecond, time.Millisecond, 1)
		free := p.occupyDecode(t)
		sub := p.submit(t, "early", 4)
		if c := nextChunk(t, sub); c.GetKind() != wire.Chunk_KIND_ACCEPTED || c.GetStage() != wire.Chunk_STAGE_PREFILL {
			t.Fatalf("got %v", c)
		}
		p.e.cancel(t, "early")
		// The decode agent's one slot is busy: the released job waits in
		// its queue, where it can be read.
		// (The busy job's ack runs beside its engine call, so the busy job
		// may still be the one stored when early's is not yet: wait for
		// early's.)
		decodeSubj := pdSubject(t, subjects.PoolDecode, pd.VLLM)
		st, err := p.e.js.Stream(context.Background(), agent.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		var dj wire.Job
		testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
			if n := p.e.queued(t, agent.DefaultStream, decodeSubj); n != 1 {
				return fmt.Errorf("%d decode jobs queued", n)
			}
			m, err := st.GetLastMsgForSubject(context.Background(), decodeSubj)
			if err != nil {
				return err
			}
			if err := proto.Unmarshal(m.Data, &dj); err != nil {
				t.Fatal(err)
			}
			if dj.GetRequestId() != "early" {
				return fmt.Errorf("queued decode job is %q's", dj.GetRequestId())
			}
			return nil
		})
		if dj.GetRequestId() != "early" || !dj.GetRelease() {
			t.Fatalf("queued decode job %q release=%v, want early's, marked release", dj.GetRequestId(), dj.GetRelease())
		}
		free()
		p.tookHandoffSilently(t, "early")
		if n := p.pre.Aborted(); n != 0 {
			t.Fatalf("prefill engine aborted %d requests", n)
		}
		noKVHeld(t, p.pre)
		noOutput(t, pending(t, sub))
	})

	t.Run("released decode job, its cancel never heard", func(t *testing.T) {
		// A decode agent that joined after the cancel (or missed it) knows
		// from the job alone: it takes the hand-off and stops.
		p := startPair(t, pd.VLLM, time.Millisecond, 5*time.Millisecond, 1)
		reply, sub := p.e.replies(t, "orphan")
		kv := simHandoff(t, p, "orphan")
		p.e.publishJob(t, pdSubject(t, subjects.PoolDecode, pd.VLLM), &wire.Job{RequestId: "orphan", ReplySubject: reply, Release: true,
			Pd:   &wire.PDHandoff{Protocol: pd.VLLM, PrefillAgent: "pre", KvTransferParamsJson: kv},
			Body: []byte(`{"model":"m","messages":[{"role":"user","content":"tell me about orphan"}],"max_tokens":4}`)})
		p.tookHandoffSilently(t, "orphan")
		if n := p.dec.Aborted(); n != 1 {
			t.Fatalf("decode engine aborted %d requests, want 1 (at its first chunk)", n)
		}
		noKVHeld(t, p.pre)
		noOutput(t, pending(t, sub))
	})
}

// cancelAfterHandoff: the decode leg has its hand-off and waits for its
// first chunk (one ITL after the KV) when the cancel comes.
func cancelAfterHandoff(t *testing.T, protocol string) {
	p := startPair(t, protocol, time.Millisecond, time.Second, 1)
	sub := p.submit(t, "c1", 4)
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if !p.watch.run("c1").started {
			return fmt.Errorf("decode leg not started")
		}
		return nil
	})
	p.e.cancel(t, "c1")
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if r := p.watch.run("c1"); !r.ended {
			return fmt.Errorf("decode leg still running")
		}
		return nil
	})
	p.idle(t)
	if r := p.watch.run("c1"); !r.firstChunk {
		t.Fatalf("the decode leg was aborted before it took the hand-off (err %v)", r.err)
	}
	if n := p.dec.KVTransferFailures(); n != 0 {
		t.Fatalf("%d KV transfers failed", n)
	}
	if n := p.dec.Aborted(); n != 1 {
		t.Fatalf("decode engine aborted %d requests, want 1 (after its first chunk)", n)
	}
	if n := p.pre.Aborted(); n != 0 {
		t.Fatalf("prefill engine aborted %d requests: its leg was done", n)
	}
	noKVHeld(t, p.pre)
	noOutput(t, pending(t, sub))
}

// occupyDecode fills the decode agent's one slot with a request held at
// the engine's door, so decode jobs wait in their queue; free lets it
// finish.
func (p *pdPair) occupyDecode(t *testing.T) (free func()) {
	t.Helper()
	busy := make(chan struct{})
	p.watch.mu.Lock()
	p.watch.gates["busy"] = busy
	p.watch.mu.Unlock()
	sub := p.submit(t, "busy", 4)
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if !p.watch.run("busy").started {
			return fmt.Errorf("busy decode leg not started")
		}
		return nil
	})
	return func() {
		close(busy)
		for c := nextChunk(t, sub); c.GetKind() != wire.Chunk_KIND_FINAL; c = nextChunk(t, sub) {
			if c.GetKind() == wire.Chunk_KIND_ERROR {
				t.Fatalf("busy request failed: %v", c.GetError())
			}
		}
	}
}

// tookHandoffSilently waits for id's decode leg to end, both agents to be
// idle, and checks that the leg reached its first chunk: it read the
// hand-off's KV from the prefill engine.
func (p *pdPair) tookHandoffSilently(t *testing.T, id string) {
	t.Helper()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if r := p.watch.run(id); !r.ended {
			return fmt.Errorf("the decode leg of %s has not run: %+v", id, r)
		}
		return nil
	})
	p.idle(t)
	if r := p.watch.run(id); !r.firstChunk {
		t.Fatalf("the decode leg of %s never took its hand-off (err %v)", id, r.err)
	}
}

// simHandoff runs a vLLM prefill leg for id on the pair's prefill engine,
// outside any agent, and returns the kv_transfer_params it answered: the
// engine now holds that KV for a decode.
func simHandoff(t *testing.T, p *pdPair, id string) []byte {
	t.Helper()
	held, _ := p.pre.HeldKV()
	eng, err := pd.New(sim.New(p.pre), pd.VLLM)
	if err != nil {
		t.Fatal(err)
	}
	job := &wire.Job{RequestId: id, Body: fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":"tell me about %s"}],"max_tokens":4}`, id)}
	var kv []byte
	err = eng.Prefill(context.Background(), &agent.Request{RequestID: id, Body: job.GetBody(), Job: job}, func(h *wire.PDHandoff) error {
		kv = h.GetKvTransferParamsJson()
		return nil
	})
	if err != nil || kv == nil {
		t.Fatalf("prefill leg: %v (kv_transfer_params %s)", err, kv)
	}
	if h, _ := p.pre.HeldKV(); h != held+1 {
		t.Fatalf("the prefill engine holds %d hand-offs after the leg, want %d", h, held+1)
	}
	return kv
}

// TestSecondDecodeLegSilent: two prefill legs of one attempt (an offer
// that moved to the shared queue as its agent took it, the second leg
// stopped only after its hand-off) send two decode jobs, and one decode
// agent pulls both, the second while the first runs or after it ended.
// The broker cannot tell two runs of one agent apart (and has no call
// left to tell a run after the end to), so the agent does: one speaks,
// the other takes its hand-off in silence and stops, and the client's
// stream is one sequence with nothing twice or missing. No KV is left
// held on the prefill engine.
func TestSecondDecodeLegSilent(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprintf("after_end=%v", after), func(t *testing.T) { secondDecodeLeg(t, after) })
	}
}

func secondDecodeLeg(t *testing.T, afterEnd bool) {
	p := startPair(t, pd.VLLM, time.Millisecond, 40*time.Millisecond, 2)
	reply, sub := p.e.replies(t, "twice")
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"tell me about twice"}],"max_tokens":4}`)
	kvs := [][]byte{simHandoff(t, p, "twice"), simHandoff(t, p, "twice")}
	var chunks []*wire.Chunk
	final := func() {
		testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
			chunks = append(chunks, pending(t, sub)...)
			if len(chunks) == 0 || chunks[len(chunks)-1].GetKind() != wire.Chunk_KIND_FINAL {
				return fmt.Errorf("%d chunks, no final yet", len(chunks))
			}
			return nil
		})
	}
	for i, kv := range kvs {
		if afterEnd && i == 1 {
			final()
			p.idle(t)
		}
		p.e.publishJob(t, pdSubject(t, subjects.PoolDecode, pd.VLLM), &wire.Job{RequestId: "twice", ReplySubject: reply,
			Pd: &wire.PDHandoff{Protocol: pd.VLLM, PrefillAgent: "pre", KvTransferParamsJson: kv}, Body: body})
	}
	if !afterEnd {
		final()
	}
	noKVHeld(t, p.pre)
	p.idle(t)
	chunks = append(chunks, pending(t, sub)...)
	var text strings.Builder
	accepted, finals := 0, 0
	var seq uint64
	for _, c := range chunks {
		if c.GetKind() == wire.Chunk_KIND_KEEPALIVE {
			continue // outside the sequence
		}
		if c.GetSeq() != seq {
			t.Fatalf("chunk %d has seq %d: two streams interleaved? %v", seq, c.GetSeq(), chunks)
		}
		seq++
		switch c.GetKind() {
		case wire.Chunk_KIND_ACCEPTED:
			accepted++
		case wire.Chunk_KIND_FINAL:
			finals++
		case wire.Chunk_KIND_TOKEN:
			for _, ev := range c.GetEvents() {
				text.WriteString(ev.GetDeltaText())
			}
		default:
			t.Fatalf("got %v", c)
		}
	}
	want, err := simengine.Expect(simengine.APIChat, body)
	if err != nil {
		t.Fatal(err)
	}
	if accepted != 1 || finals != 1 || text.String() != want.Text {
		t.Fatalf("%d accepted, %d finals, text %q, want one of each and %q", accepted, finals, text.String(), want.Text)
	}
	if n := p.dec.Aborted(); n != 1 {
		t.Fatalf("decode engine aborted %d requests, want 1 (the silent leg, at its first chunk)", n)
	}
}
