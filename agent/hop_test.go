package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// tokenChunk is an engine chunk of one token, as vLLM sends it.
var tokenChunk = []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)

// hopStream returns an attempt's stream on an agent whose outbox publishes
// to a real server, with the outbox's goroutine running (started) or not
// (every chunk published at once), and a subscription to its replies.
func hopStream(tb testing.TB, started bool) (*stream, *nats.Subscription) {
	tb.Helper()
	s := natstest.RunJetStream(tb)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync("sy.reply.b.chunks")
	if err != nil {
		tb.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	a, err := New(nc, nil, Config{ID: "a1", Model: "m", Slots: 1})
	if err != nil {
		tb.Fatal(err)
	}
	if started {
		tb.Cleanup(a.out.start())
	}
	job := &wire.Job{RequestId: "b-1x", ReplySubject: "sy.reply.b.chunks", Secret: 42}
	out := newStream(a, job)
	out.spoke = true // no keep-alives
	return out, sub
}

// TestHeldTextsSurvive: the texts of the events a stream holds while the
// engine's next chunks are already read (their raw bytes copied, the
// engine's buffer reused) reach the broker as the engine sent them, plain
// ones aliasing the held bytes and escaped ones made as strings, however
// often the held buffer grows.
func TestHeldTextsSurvive(t *testing.T) {
	out, sub := hopStream(t, false)
	chunk := func(content string) string {
		return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":` + content + `},"logprobs":null,"finish_reason":null}]}`
	}
	var want []string
	engineBuf := make([]byte, 0, 512)
	for i := range 12 {
		content, text := fmt.Sprintf(`" w%d"`, i), fmt.Sprintf(" w%d", i)
		if i%3 == 1 {
			content, text = fmt.Sprintf(`"caf\u00e9 %d\n"`, i), fmt.Sprintf("café %d\n", i)
		}
		want = append(want, text)
		// The engine's buffer holds this chunk only until emit returns.
		engineBuf = append(engineBuf[:0], chunk(content)...)
		if err := out.emit(engineBuf, i < 11); err != nil {
			t.Fatal(err)
		}
		for j := range engineBuf {
			engineBuf[j] = 'x'
		}
	}
	var got []string
	for len(got) < len(want) {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("after %d texts: %v", len(got), err)
		}
		_ = wire.Frames(m.Data, func(b []byte) error {
			c := new(wire.Chunk)
			if err := proto.Unmarshal(b, c); err != nil {
				t.Fatal(err)
			}
			for _, ev := range c.GetEvents() {
				got = append(got, ev.GetDeltaText())
			}
			return nil
		})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("texts %q, want %q", got, want)
	}
}

// BenchmarkLongBatch is a stream that holds many events at once (an
// engine's chunks read faster than they are sent): it should make room
// for them in a few blocks, not one allocation per event.
func BenchmarkLongBatch(b *testing.B) {
	base, _ := hopStream(b, false)
	const n = 40
	b.ReportAllocs()
	for b.Loop() {
		out := newStream(base.a, base.job)
		out.spoke = true
		for i := range n {
			if err := out.emit(tokenChunk, i < n-1); err != nil {
				b.Fatal(err)
			}
		}
		out.finish()
	}
}

// shortEngine answers every request with a short stream (role, one
// token, finish, usage) from chunks made once: it allocates nothing.
type shortEngine struct{ chunks [][]byte }

func (e shortEngine) Stream(_ context.Context, _ *Request, emit Emit) error {
	for i, c := range e.chunks {
		if err := emit(c, i < len(e.chunks)-1); err != nil {
			return err
		}
	}
	return nil
}

// fakeJob is a job message whose acks go nowhere.
type fakeJob struct{ data []byte }

func (m *fakeJob) Data() []byte                     { return m.data }
func (m *fakeJob) Ack() error                       { return nil }
func (m *fakeJob) DoubleAck(context.Context) error  { return nil }
func (m *fakeJob) Nak() error                       { return nil }
func (m *fakeJob) NakWithDelay(time.Duration) error { return nil }
func (m *fakeJob) Term() error                      { return nil }

// shortJobAgent returns hopStream's agent serving shortEngine, a
// subscription to its replies, and a maker of jobs that are each a
// request of their own (a second copy of an attempt is dropped unrun).
func shortJobAgent(tb testing.TB) (*Agent, *nats.Subscription, func() *fakeJob) {
	base, sub := hopStream(tb, false)
	a := base.a
	a.engine = shortEngine{chunks: [][]byte{roleChunk, tokenChunk,
		[]byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`),
		[]byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`),
	}}
	n := 0
	return a, sub, func() *fakeJob {
		n++
		data, err := proto.Marshal(&wire.Job{RequestId: fmt.Sprintf("b-%dx", n), Attempt: 1, ReplySubject: "sy.reply.b.chunks", Secret: 42,
			Api: wire.API_API_CHAT, Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)})
		if err != nil {
			tb.Fatal(err)
		}
		return &fakeJob{data: data}
	}
}

// TestHandleShortJobs: every job handled is answered: its accepted
// chunk, its token and its final.
func TestHandleShortJobs(t *testing.T) {
	a, sub, job := shortJobAgent(t)
	ctx := context.WithoutCancel(t.Context())
	const jobs = 20
	for range jobs {
		a.handle(ctx, job())
	}
	finals := 0
	for finals < jobs {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d jobs answered: %v", finals, jobs, err)
		}
		_ = wire.Frames(m.Data, func(b []byte) error {
			c := new(wire.Chunk)
			if err := proto.Unmarshal(b, c); err != nil {
				t.Fatal(err)
			}
			if c.GetKind() == wire.Chunk_KIND_FINAL {
				finals++
			}
			return nil
		})
	}
}

// BenchmarkHandleJob is an agent's whole handling of a short job (decode,
// its stream, context and keep-alive, its accepted chunk and ack, the
// engine call's emits, the answer's end); what a job needs of its own
// comes in one block (jobRun).
func BenchmarkHandleJob(b *testing.B) {
	a, sub, job := shortJobAgent(b)
	_ = sub.Unsubscribe() // the answers are not read
	ctx := context.WithoutCancel(b.Context())
	jobs := make([]*fakeJob, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		if len(jobs) == 0 {
			for range cap(jobs) {
				jobs = append(jobs, job())
			}
		}
		j := jobs[len(jobs)-1]
		jobs = jobs[:len(jobs)-1]
		b.StartTimer()
		a.handle(ctx, j)
	}
}

// A short answer (role, one token, finish and usage chunks, as vLLM
// streams max_tokens 1 with usage) reaches the broker as the engine sent
// it: its events, then its final with the usage.
func TestShortAnswerChunks(t *testing.T) {
	base, sub := hopStream(t, false)
	role := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
	finish := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`)
	usage := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	answer := func() {
		out := newStream(base.a, base.job)
		out.spoke = true
		for i, c := range [][]byte{role, tokenChunk, finish, usage} {
			if err := out.emit(c, i < 2); err != nil {
				t.Fatal(err)
			}
		}
		out.finish()
	}
	answer()
	var texts []string
	for range 2 {
		m, err := sub.NextMsg(5e9)
		if err != nil {
			t.Fatal(err)
		}
		_ = wire.Frames(m.Data, func(b []byte) error {
			c := new(wire.Chunk)
			if err := proto.Unmarshal(b, c); err != nil {
				t.Fatal(err)
			}
			for _, ev := range c.GetEvents() {
				texts = append(texts, string(ev.GetRaw()))
			}
			if c.GetKind() == wire.Chunk_KIND_FINAL {
				texts = append(texts, c.GetUsage().String(), string(c.GetRaw()))
			}
			return nil
		})
	}
	if want := []string{string(role), string(tokenChunk), string(finish)}; len(texts) != 5 || fmt.Sprint(texts[:3]) != fmt.Sprint(want) || texts[4] != string(usage) {
		t.Fatalf("the answer's chunks carried %q", texts)
	}
}

// BenchmarkShortAnswer is a short answer's stream (role, one token,
// finish and usage): its events, their held bytes and its usage live in
// the stream, so it costs few allocations beyond the stream.
func BenchmarkShortAnswer(b *testing.B) {
	base, _ := hopStream(b, false)
	chunks := [][]byte{roleChunk, tokenChunk,
		[]byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`),
		[]byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)}
	b.ReportAllocs()
	for b.Loop() {
		out := newStream(base.a, base.job)
		out.spoke = true
		for i, c := range chunks {
			if err := out.emit(c, i < 2); err != nil {
				b.Fatal(err)
			}
		}
		out.finish()
	}
}

// BenchmarkEmitToken is the agent's hop for one token: reading the chunk, the
// token message, framing and the NATS publish, with the outbox flushing
// inline (outbox=off) or on its goroutine (outbox=on, as an agent runs).
func BenchmarkEmitToken(b *testing.B) {
	for _, started := range []bool{false, true} {
		name := "outbox=off"
		if started {
			name = "outbox=on"
		}
		b.Run(name, func(b *testing.B) {
			out, _ := hopStream(b, started)
			b.ReportAllocs()
			for b.Loop() {
				if err := out.emit(tokenChunk, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A chunk that would take the message it joins over wire.MaxFrameBatch
// starts a message of its own, after the one it would have joined; the
// next chunk starts another, the big one's being full. Order is kept.
func TestOutboxBigChunkStartsAMessage(t *testing.T) {
	out, sub := hopStream(t, false)
	o := out.a.out
	o.mu.Lock()
	o.running = true // gather without a flushing goroutine
	o.mu.Unlock()
	small := &wire.Chunk{RequestId: "b-1x", Kind: wire.Chunk_KIND_ACCEPTED}
	big := &wire.Chunk{RequestId: "b-1x", Seq: 1, Kind: wire.Chunk_KIND_FINAL, Raw: make([]byte, wire.MaxFrameBatch)}
	for _, c := range []*wire.Chunk{small, big, small} {
		enc, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.put("sy.reply.b.chunks", enc, anyWait); err != nil {
			t.Fatal(err)
		}
	}
	o.mu.Lock()
	_ = o.flushLocked()
	o.mu.Unlock()
	var kinds [][]wire.Chunk_Kind
	for range 3 {
		kinds = append(kinds, nextKinds(t, sub, 5*time.Second))
	}
	if fmt.Sprint(kinds) != "[[KIND_ACCEPTED] [KIND_FINAL] [KIND_ACCEPTED]]" {
		t.Fatalf("messages hold %v, want [ACCEPTED] [FINAL] [ACCEPTED]", kinds)
	}
}

// A job's ack given to the outbox waits for its next flush and goes out
// in it, ahead of the chunks gathered meanwhile (one write for the ack
// and the accepted chunk); an outbox not running acks at once.
func TestOutboxAcksWithItsFlush(t *testing.T) {
	out, sub := hopStream(t, false)
	o := out.a.out
	ctx := context.Background()
	js, err := jetstream.New(out.a.nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "J", Subjects: []string{"j.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() jetstream.Msg {
		t.Helper()
		if _, err := js.Publish(ctx, "j.1", []byte("job")); err != nil {
			t.Fatal(err)
		}
		b, err := cons.Fetch(1)
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			return m
		}
		t.Fatalf("no job: %v", b.Error())
		return nil
	}
	ackPending := func() int {
		t.Helper()
		if err := out.a.nc.Flush(); err != nil { // what was published has reached the server
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending
	}

	o.mu.Lock()
	o.running = true // gather without a flushing goroutine
	o.mu.Unlock()
	job := fetch()
	order := &orderedAck{Msg: job, nc: out.a.nc, sub: sub}
	if err := o.ack(order); err != nil {
		t.Fatal(err)
	}
	if err := out.send(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED}); err != nil {
		t.Fatal(err)
	}
	if n := ackPending(); n != 1 {
		t.Fatalf("before the flush: %d jobs waiting for their ack, want 1", n)
	}
	o.mu.Lock()
	_ = o.flushLocked()
	o.mu.Unlock()
	if !order.acked || order.chunksBefore != 0 {
		t.Fatalf("flush: acked %v with %d chunk messages out before it; want true, 0", order.acked, order.chunksBefore)
	}
	// The server applies acks on its own goroutine: wait for the state.
	noAckPending := func(when string) {
		t.Helper()
		testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
			if n := ackPending(); n != 0 {
				return fmt.Errorf("%s: %d jobs waiting for their ack, want 0", when, n)
			}
			return nil
		})
	}
	noAckPending("after the flush")
	if m, err := sub.NextMsg(5e9); err != nil || m.Data[0] != wire.FrameMarker {
		t.Fatalf("accepted chunk: %v", err)
	}

	o.mu.Lock()
	o.running = false
	o.mu.Unlock()
	if err := o.ack(fetch()); err != nil {
		t.Fatal(err)
	}
	noAckPending("outbox not running")
}

// orderedAck records, when it acks, how many chunk messages had reached
// sub (on nc) before.
type orderedAck struct {
	jetstream.Msg
	nc           *nats.Conn
	sub          *nats.Subscription
	acked        bool
	chunksBefore int
}

func (a *orderedAck) Ack() error {
	_ = a.nc.Flush()
	a.chunksBefore, _, _ = a.sub.Pending()
	a.acked = true
	return a.Msg.Ack()
}

// nextKinds returns the kinds of the chunks in sub's next message, failing
// t if none comes within wait.
func nextKinds(t *testing.T, sub *nats.Subscription, wait time.Duration) []wire.Chunk_Kind {
	t.Helper()
	m, err := sub.NextMsg(wait)
	if err != nil {
		t.Fatalf("no reply message within %s: %v", wait, err)
	}
	var ks []wire.Chunk_Kind
	if err := wire.Frames(m.Data, func(b []byte) error {
		c := new(wire.Chunk)
		if err := proto.Unmarshal(b, c); err != nil {
			return err
		}
		ks = append(ks, c.GetKind())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ks
}

// lingering returns hopStream's stream with its outbox running and
// lingering for linger, and a channel that receives as each flush starts
// to wait.
func lingering(t *testing.T, linger time.Duration) (*stream, *nats.Subscription, <-chan struct{}) {
	out, sub := hopStream(t, false)
	waits := make(chan struct{}, 16)
	out.a.out.linger = linger
	out.a.out.onLinger = func() {
		select {
		case waits <- struct{}{}:
		default:
		}
	}
	t.Cleanup(out.a.out.start())
	return out, sub, waits
}

// waitLinger waits until the outbox starts to linger.
func waitLinger(t *testing.T, waits <-chan struct{}) {
	t.Helper()
	select {
	case <-waits:
	case <-time.After(10 * time.Second):
		t.Fatal("the outbox did not linger")
	}
}

// putKind frames a chunk of kind that may wait wait into o's message for
// the hop's reply subject.
func putKind(t *testing.T, o *outbox, kind wire.Chunk_Kind, wait time.Duration) {
	t.Helper()
	enc, err := proto.Marshal(&wire.Chunk{RequestId: "b-1x", Kind: kind})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.put("sy.reply.b.chunks", enc, wait); err != nil {
		t.Fatal(err)
	}
}

// putPair puts a chunk of kind a that may wait aWait, then one of kind b
// that may wait bWait, into o, and returns how long until sub got them,
// failing t unless they come in one message.
func putPair(t *testing.T, o *outbox, sub *nats.Subscription, a wire.Chunk_Kind, aWait time.Duration, b wire.Chunk_Kind, bWait time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	putKind(t, o, a, aWait)
	putKind(t, o, b, bWait)
	want := fmt.Sprint([]wire.Chunk_Kind{a, b})
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != want {
		t.Fatalf("message holds %v, want %s", ks, want)
	}
	return time.Since(start)
}

// A quiet outbox sends a chunk at once; one that sent a message less than
// its linger ago gathers what comes next into one message, sent a linger
// after the last.
func TestOutboxLingersWhenBusy(t *testing.T) {
	const linger = 3 * time.Second
	out, sub, _ := lingering(t, linger)
	o := out.a.out
	start := time.Now()
	putKind(t, o, wire.Chunk_KIND_ACCEPTED, anyWait)
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_ACCEPTED]" {
		t.Fatalf("first message holds %v, want [ACCEPTED]", ks)
	}
	if d := time.Since(start); d >= linger/2 {
		t.Fatalf("a quiet outbox's chunk took %s, as if it lingered (%s)", d, linger)
	}
	if d := putPair(t, o, sub, wire.Chunk_KIND_TOKEN, anyWait, wire.Chunk_KIND_KEEPALIVE, anyWait); d < linger/2 {
		t.Fatalf("a busy outbox sent its next message after %s, want about its linger (%s)", d, linger)
	}
	// Quiet again once a linger passed since its last message, whatever
	// kick the last flush left behind (the keep-alive's).
	time.Sleep(linger * 6 / 5)
	quiet := time.Now()
	putKind(t, o, wire.Chunk_KIND_FINAL, anyWait)
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_FINAL]" {
		t.Fatalf("third message holds %v, want [FINAL]", ks)
	}
	if d := time.Since(quiet); d >= linger/2 {
		t.Fatalf("a chunk put a linger after the last message took %s, as if the outbox were still busy", d)
	}
}

// An urgent chunk ends the linger: it leaves at once with what waited.
func TestOutboxUrgentEndsTheLinger(t *testing.T) {
	out, sub, waits := lingering(t, time.Hour)
	o := out.a.out
	putKind(t, o, wire.Chunk_KIND_ACCEPTED, anyWait) // quiet: at once
	nextKinds(t, sub, 10*time.Second)
	putKind(t, o, wire.Chunk_KIND_TOKEN, anyWait)
	waitLinger(t, waits) // the outbox lingers on the token
	putKind(t, o, wire.Chunk_KIND_FINAL, 0)
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_TOKEN KIND_FINAL]" {
		t.Fatalf("message holds %v, want the waiting token and the final", ks)
	}
}

// A chunk that may wait less than the linger leaves when its wait ends,
// with what waited with it; one that comes while a flush lingers, and
// may wait less than that flush would, shortens it.
func TestOutboxChunkWaitsNoMoreThanItMay(t *testing.T) {
	const may = 50 * time.Millisecond
	out, sub, waits := lingering(t, time.Hour)
	o := out.a.out
	putKind(t, o, wire.Chunk_KIND_ACCEPTED, anyWait) // quiet: at once
	nextKinds(t, sub, 10*time.Second)

	if d := putPair(t, o, sub, wire.Chunk_KIND_KEEPALIVE, anyWait, wire.Chunk_KIND_TOKEN, may); d < may/2 {
		t.Fatalf("the token left after %s: it did not wait (it may wait %s)", d, may)
	}

	for len(waits) > 0 { // the first flush's
		<-waits
	}
	putKind(t, o, wire.Chunk_KIND_KEEPALIVE, anyWait)
	waitLinger(t, waits) // lingering for the hour
	putKind(t, o, wire.Chunk_KIND_TOKEN, may)
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_KEEPALIVE KIND_TOKEN]" {
		t.Fatalf("message holds %v, want the keep-alive and the token", ks)
	}
}

// Through an attempt's stream: a token waits at most half the time since
// the stream's token before, so a stream's tokens never catch up with
// each other in the outbox, whatever the linger.
func TestStreamTokenWaitsHalfItsInterval(t *testing.T) {
	out, sub, waits := lingering(t, time.Hour)
	if err := out.emit(tokenChunk, false); err != nil { // the first text: at once
		t.Fatal(err)
	}
	nextKinds(t, sub, 10*time.Second)
	const gap = 100 * time.Millisecond
	time.Sleep(gap)
	sent := time.Now()
	if err := out.emit(tokenChunk, false); err != nil {
		t.Fatal(err)
	}
	waitLinger(t, waits)
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_TOKEN]" {
		t.Fatalf("message holds %v, want the second token", ks)
	}
	if d := time.Since(sent); d < gap/4 {
		t.Fatalf("the second token left after %s, want about half its interval (%s)", d, gap/2)
	}
}

// roleChunk is the first chunk vLLM (and sim-engine) streams: a role and
// no text.
var roleChunk = []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)

// Through an attempt's stream: its first text and its end never wait for
// the linger, nor does a role-only chunk before the text; a later token
// waits, and leaves with the end.
func TestStreamFirstTokenAndEndDoNotLinger(t *testing.T) {
	out, sub, waits := lingering(t, time.Hour)
	if err := out.send(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED}); err != nil {
		t.Fatal(err)
	}
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_ACCEPTED]" {
		t.Fatalf("first message holds %v, want [ACCEPTED] (a quiet outbox)", ks)
	}
	if err := out.emit(roleChunk, false); err != nil {
		t.Fatal(err)
	}
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_TOKEN]" {
		t.Fatalf("the role chunk's message holds %v, want [TOKEN]", ks)
	}
	if err := out.emit(tokenChunk, false); err != nil {
		t.Fatal(err)
	}
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_TOKEN]" {
		t.Fatalf("the first text's message holds %v, want [TOKEN]", ks)
	}
	// A second apart, the next token may wait half a second.
	time.Sleep(time.Second)
	if err := out.emit(tokenChunk, false); err != nil {
		t.Fatal(err)
	}
	waitLinger(t, waits) // the second token waits
	if m, err := sub.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("the second token did not wait for the linger: %d bytes", len(m.Data))
	}
	out.finish()
	if ks := nextKinds(t, sub, 10*time.Second); fmt.Sprint(ks) != "[KIND_TOKEN KIND_FINAL]" {
		t.Fatalf("the end's message holds %v, want the second token and the final", ks)
	}
}

// A zero ReplyLinger takes the default; a negative one turns it off.
func TestReplyLingerConfig(t *testing.T) {
	nc, err := nats.Connect(natstest.RunJetStream(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, tc := range []struct {
		set, want time.Duration
	}{{0, DefaultReplyLinger}, {-1, 0}, {2 * time.Millisecond, 2 * time.Millisecond}} {
		a, err := New(nc, nil, Config{ID: "a1", Model: "m", Slots: 1, ReplyLinger: tc.set})
		if err != nil {
			t.Fatal(err)
		}
		if a.out.linger != tc.want {
			t.Errorf("ReplyLinger %s: the outbox lingers %s, want %s", tc.set, a.out.linger, tc.want)
		}
	}
}
