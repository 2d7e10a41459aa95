package natsauth

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/sim"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// shippedConfig is the example configuration users deploy; the tests run
// against it unchanged apart from where the server listens and stores.
const shippedConfig = "../../deploy/nats/server.conf"

const stream = broker.DefaultStream

// testPasswords are the test values of the environment variables that
// server.conf reads. Real deployments set their own (change me).
var testPasswords = map[string]struct{ env, password string }{
	"broker-1":      {"SY_NATS_BROKER_PASSWORD", "test-broker-change-me"},
	"agent-regular": {"SY_NATS_AGENT_REGULAR_PASSWORD", "test-regular-change-me"},
	"agent-prefill": {"SY_NATS_AGENT_PREFILL_PASSWORD", "test-prefill-change-me"},
	"agent-decode":  {"SY_NATS_AGENT_DECODE_PASSWORD", "test-decode-change-me"},
	"observer":      {"SY_NATS_OBSERVER_PASSWORD", "test-observer-change-me"},
	"sys":           {"SY_NATS_SYS_PASSWORD", "test-sys-change-me"},
}

func shippedOptions(t *testing.T) *server.Options {
	t.Helper()
	for _, p := range testPasswords {
		t.Setenv(p.env, p.password)
	}
	opts, err := ServerOptions(shippedConfig)
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

func runShipped(t *testing.T) *server.Server {
	t.Helper()
	opts := shippedOptions(t)
	opts.Host = "127.0.0.1"
	opts.Port = -1
	opts.StoreDir = t.TempDir()
	opts.NoLog = true
	opts.NoSigs = true
	if w := CheckExposure(opts); w != "" {
		t.Fatalf("loopback test server: unexpected warning %q", w)
	}
	return natstest.RunServer(t, opts)
}

// client is one authenticated connection; errs receives the asynchronous
// errors (permission violations) the server sends it.
type client struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func connectAs(t *testing.T, s *server.Server, user string) *client {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := RegisterClientFlags(fs)
	if err := fs.Parse([]string{"--nats-user", user, "--nats-password", testPasswords[user].password}); err != nil {
		t.Fatal(err)
	}
	opts, err := f.Options()
	if err != nil {
		t.Fatal(err)
	}
	c := &client{user: user, errs: make(chan error, 256)}
	opts = append(opts, nats.Name(user), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	}))
	c.nc, err = nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(c.nc.Close)
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatal(err)
	}
	return c
}

// denied waits for the server's permission violation naming subject. The
// server answers a forbidden PUB or SUB with -ERR before the PONG of the
// flush, so the error is on its way once Flush returns.
func (c *client) denied(t *testing.T, op, subject string) {
	t.Helper()
	if err := c.nc.Flush(); err != nil {
		t.Fatalf("%s: flush: %v", c.user, err)
	}
	want := op + ` to "` + subject + `"`
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(strings.ToLower(err.Error()), strings.ToLower(want)) {
				return
			}
		case <-timeout:
			t.Fatalf("%s: no permission violation for %s", c.user, want)
		}
	}
}

func (c *client) deniedSubscribe(t *testing.T, subject string) {
	t.Helper()
	sub, err := c.nc.SubscribeSync(subject)
	if err != nil {
		t.Fatalf("%s: subscribe %s: %v", c.user, subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	c.denied(t, "Subscription", subject)
}

// deniedRequest sends a request the server must refuse to deliver: it is
// never answered and the publish is reported as a violation.
func (c *client) deniedRequest(t *testing.T, subject string, data []byte) {
	t.Helper()
	if _, err := c.nc.Request(subject, data, 300*time.Millisecond); err == nil {
		t.Fatalf("%s: request to %s answered", c.user, subject)
	}
	c.denied(t, "Publish", subject)
}

func recv(t *testing.T, sub *nats.Subscription) *nats.Msg {
	t.Helper()
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("receive on %s: %v", sub.Subject, err)
	}
	return m
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// ensureStream creates the jobs stream as the real broker does.
func ensureStream(t *testing.T, c *client) {
	t.Helper()
	b, err := broker.New(c.nc, broker.Config{ID: "broker-1"}, broker.WithLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EnsureStream(ctxT(t)); err != nil {
		t.Fatalf("broker EnsureStream: %v", err)
	}
	// Idempotent: the second call takes the update path.
	if err := b.EnsureStream(ctxT(t)); err != nil {
		t.Fatalf("broker EnsureStream again: %v", err)
	}
}

func consumerConfig(t *testing.T, model, pool string) jetstream.ConsumerConfig {
	t.Helper()
	name, err := subjects.ConsumerName(model, pool)
	if err != nil {
		t.Fatal(err)
	}
	filter, err := subjects.Must(subjects.DefaultPrefix).Jobs(model, pool)
	if err != nil {
		t.Fatal(err)
	}
	return jetstream.ConsumerConfig{
		Durable:       name,
		FilterSubject: filter,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: -1,
		MaxWaiting:    4096,
	}
}

// pdConsumerConfig is consumerConfig for a PD pool's queue of the vllm
// pairing, as a PD agent binds it.
func pdConsumerConfig(t *testing.T, model, pool string) jetstream.ConsumerConfig {
	t.Helper()
	cfg := consumerConfig(t, model, pool)
	pair := subjects.PairKey("vllm", "")
	var err error
	if cfg.Durable, err = subjects.PDConsumerName(model, pool, pair); err != nil {
		t.Fatal(err)
	}
	if cfg.FilterSubject, err = subjects.Must(subjects.DefaultPrefix).PDJobs(model, pool, pair); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestUnauthenticatedRefused(t *testing.T) {
	s := runShipped(t)
	if nc, err := nats.Connect(s.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("no credentials: err = %v, want authorization violation", err)
	}
	if nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("broker-1", "wrong")); err == nil {
		nc.Close()
		t.Fatal("connected with a wrong password")
	}
}

func TestBrokerPermissions(t *testing.T) {
	s := runShipped(t)
	b := connectAs(t, s, "broker-1")
	a := connectAs(t, s, "agent-regular")
	ensureStream(t, b)

	if _, err := b.js.Stream(ctxT(t), stream); err != nil {
		t.Errorf("broker stream info: %v", err)
	}
	if _, err := b.js.Publish(ctxT(t), "sy.jobs.m.regular", []byte("job")); err != nil {
		t.Fatalf("broker publishes a job: %v", err)
	}

	hb, err := b.nc.SubscribeSync("sy.hb.>")
	if err != nil {
		t.Fatal(err)
	}
	replies, err := b.nc.SubscribeSync("sy.reply.broker-1.*")
	if err != nil {
		t.Fatal(err)
	}
	cancels, err := a.nc.SubscribeSync("sy.cancel.*")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client{a, b} {
		if err := c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.nc.Publish("sy.hb.m.regular.a1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	recv(t, hb)
	if err := a.nc.Publish("sy.reply.broker-1.r1", []byte("chunk")); err != nil {
		t.Fatal(err)
	}
	recv(t, replies)
	if err := b.nc.Publish("sy.cancel.r1", nil); err != nil {
		t.Fatal(err)
	}
	recv(t, cancels)

	t.Run("refused", func(t *testing.T) {
		b.deniedSubscribe(t, "sy.jobs.>")           // reading jobs raw
		b.deniedSubscribe(t, "sy.reply.broker-2.*") // another broker's replies
		b.deniedSubscribe(t, "sy.cancel.*")
		b.deniedSubscribe(t, "_INBOX.agent-regular.>")
		if err := b.nc.Publish("sy.hb.m.regular.forged", []byte("{}")); err != nil {
			t.Fatal(err)
		}
		b.denied(t, "Publish", "sy.hb.m.regular.forged")
		b.deniedRequest(t, "$JS.API.STREAM.DELETE."+stream, nil)
		b.deniedRequest(t, "$JS.API.STREAM.PURGE."+stream, nil)
		b.deniedRequest(t, "$JS.API.STREAM.MSG.GET."+stream, []byte(`{"seq":1}`))
		b.deniedRequest(t, "$JS.API.DIRECT.GET."+stream, []byte(`{"seq":1}`))
		b.deniedRequest(t, "$JS.API.STREAM.CREATE.OTHER", []byte(`{"name":"OTHER","subjects":["x.>"]}`))
	})
}

func TestAgentPermissions(t *testing.T) {
	s := runShipped(t)
	b := connectAs(t, s, "broker-1")
	a := connectAs(t, s, "agent-regular")
	ensureStream(t, b)
	if _, err := b.js.Publish(ctxT(t), "sy.jobs.m.regular", []byte("job-1")); err != nil {
		t.Fatal(err)
	}

	cons, err := a.js.CreateOrUpdateConsumer(ctxT(t), stream, consumerConfig(t, "m", subjects.PoolRegular))
	if err != nil {
		t.Fatalf("agent creates its durable consumer: %v", err)
	}
	// A second agent of the pool binds to the same consumer.
	if _, err := a.js.CreateOrUpdateConsumer(ctxT(t), stream, consumerConfig(t, "m", subjects.PoolRegular)); err != nil {
		t.Fatalf("agent binds the existing consumer: %v", err)
	}
	if _, err := cons.Info(ctxT(t)); err != nil {
		t.Errorf("agent consumer info: %v", err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	var got int
	for msg := range batch.Messages() {
		got++
		if string(msg.Data()) != "job-1" {
			t.Errorf("job = %q", msg.Data())
		}
		if err := msg.DoubleAck(ctxT(t)); err != nil {
			t.Fatalf("double ack: %v", err)
		}
	}
	if err := batch.Error(); err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if got != 1 {
		t.Fatalf("fetched %d jobs, want 1", got)
	}
	// Nak and Term publish to the same $JS.ACK subjects.
	if _, err := b.js.Publish(ctxT(t), "sy.jobs.m.regular", []byte("job-2")); err != nil {
		t.Fatal(err)
	}
	batch, err = cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.Term(); err != nil {
			t.Fatalf("term: %v", err)
		}
	}

	if _, err := a.nc.SubscribeSync("sy.cancel.*"); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"sy.hb.m.regular.a1", "sy.reply.broker-1.r1"} {
		if err := a.nc.Publish(subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.errs:
		t.Fatalf("agent's allowed operations: %v", err)
	case <-time.After(100 * time.Millisecond):
	}

	t.Run("refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := a.js.Publish(ctx, "sy.jobs.m.regular", []byte("forged")); err == nil {
			t.Error("agent published a job")
		}
		a.denied(t, "Publish", "sy.jobs.m.regular")
		a.deniedSubscribe(t, "sy.reply.>")
		a.deniedSubscribe(t, "sy.hb.>")
		a.deniedSubscribe(t, "sy.jobs.>")
		a.deniedSubscribe(t, "_INBOX.broker-1.>")
		a.deniedSubscribe(t, "_INBOX.>")
		if err := a.nc.Publish("sy.hb.m.prefill.a1", []byte("{}")); err != nil {
			t.Fatal(err)
		}
		a.denied(t, "Publish", "sy.hb.m.prefill.a1") // posing as another pool
		a.deniedRequest(t, "$JS.API.STREAM.MSG.GET."+stream, []byte(`{"seq":1}`))
		a.deniedRequest(t, "$JS.API.DIRECT.GET."+stream, []byte(`{"seq":1}`))
		a.deniedRequest(t, "$JS.API.STREAM.DELETE."+stream, nil)
		a.deniedRequest(t, "$JS.API.STREAM.INFO."+stream, nil)
		a.deniedRequest(t, "$JS.API.STREAM.UPDATE."+stream, nil)
		name, _ := subjects.ConsumerName("m", subjects.PoolRegular)
		a.deniedRequest(t, "$JS.API.CONSUMER.DELETE."+stream+"."+name, nil)
		// Consumers of another pool, or without a filter in the subject.
		other := consumerConfig(t, "m", subjects.PoolPrefill)
		ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel2()
		if _, err := a.js.CreateOrUpdateConsumer(ctx2, stream, other); err == nil {
			t.Error("regular agent created a prefill consumer")
		}
		a.denied(t, "Publish", "$JS.API.CONSUMER.CREATE."+stream+"."+other.Durable+"."+other.FilterSubject)
		a.deniedRequest(t, "$JS.API.CONSUMER.CREATE."+stream+".steal", []byte(`{}`))
		a.deniedRequest(t, "$JS.API.CONSUMER.DURABLE.CREATE."+stream+".steal", []byte(`{}`))
		a.deniedRequest(t, "$JS.API.CONSUMER.CREATE."+stream, []byte(`{}`))
	})
}

// TestPrefillHandsOffToDecode: a prefill agent may publish decode jobs and
// nothing else into the queues; a decode agent pulls them.
func TestPrefillHandsOffToDecode(t *testing.T) {
	s := runShipped(t)
	b := connectAs(t, s, "broker-1")
	p := connectAs(t, s, "agent-prefill")
	d := connectAs(t, s, "agent-decode")
	ensureStream(t, b)

	if _, err := p.js.CreateOrUpdateConsumer(ctxT(t), stream, pdConsumerConfig(t, "m", subjects.PoolPrefill)); err != nil {
		t.Fatalf("prefill consumer: %v", err)
	}
	dcons, err := d.js.CreateOrUpdateConsumer(ctxT(t), stream, pdConsumerConfig(t, "m", subjects.PoolDecode))
	if err != nil {
		t.Fatalf("decode consumer: %v", err)
	}
	if _, err := p.js.Publish(ctxT(t), "sy.jobs.m.decode.vllm", []byte("decode-job")); err != nil {
		t.Fatalf("prefill publishes a decode job: %v", err)
	}
	msg, err := dcons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("decode fetch: %v", err)
	}
	if err := msg.DoubleAck(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := d.nc.Publish("sy.hb.m.decode.d1", []byte("{}")); err != nil {
		t.Fatal(err)
	}

	for _, subj := range []string{"sy.jobs.m.regular", "sy.jobs.m.prefill.vllm"} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		if _, err := p.js.Publish(ctx, subj, []byte("forged")); err == nil {
			t.Errorf("prefill agent published to %s", subj)
		}
		cancel()
		p.denied(t, "Publish", subj)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := d.js.Publish(ctx, "sy.jobs.m.decode.vllm", []byte("forged")); err == nil {
		t.Error("decode agent published a decode job")
	}
	d.denied(t, "Publish", "sy.jobs.m.decode.vllm")
	d.deniedSubscribe(t, "_INBOX.agent-prefill.>")
}

// TestRealBrokerAndAgent runs the broker and agent packages themselves over
// the shipped configuration, so a JetStream call either adds later and the
// configuration does not allow fails here.
func TestRealBrokerAndAgent(t *testing.T) {
	s := runShipped(t)
	bc := connectAs(t, s, "broker-1")
	ac := connectAs(t, s, "agent-regular")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	b, err := broker.New(bc.nc, broker.Config{ID: "broker-1", HeartbeatInterval: 100 * time.Millisecond}, broker.WithLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	bdone := make(chan error, 1)
	go func() { bdone <- b.Run(ctx) }()
	se, err := simengine.New(simengine.Config{Model: "sim-model", TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(ac.nc, sim.New(se), agent.Config{
		ID: "a1", Model: "sim-model", Pool: subjects.PoolRegular, Slots: 2, Heartbeat: 500 * time.Millisecond, // survives a busy machine's stalls
		Engine: "sim", Transport: "inproc",
	}, agent.WithLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	adone := make(chan error, 1)
	go func() { adone <- a.Run(ctx) }()
	defer func() {
		cancel()
		<-adone
		<-bdone
	}()

	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`)
	var call *broker.Call
	deadline := time.Now().Add(10 * time.Second)
	for {
		call, err = b.Submit(ctx, broker.Request{Model: "sim-model", API: wire.API_API_CHAT, Stream: true, Body: body})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("submit: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer call.Close()
	for {
		ch, err := call.Next(ctxT(t))
		if err != nil {
			t.Fatalf("next chunk: %v", err)
		}
		if ch.GetKind() == wire.Chunk_KIND_ERROR {
			t.Fatalf("error chunk: %v", ch)
		}
		if ch.GetKind() == wire.Chunk_KIND_FINAL {
			break
		}
	}
	for _, c := range []*client{bc, ac} {
		select {
		case err := <-c.errs:
			t.Errorf("%s: %v", c.user, err)
		default:
		}
	}
}

func TestCheckExposure(t *testing.T) {
	shipped := shippedOptions(t)
	tests := []struct {
		name string
		opts *server.Options
		want []string // substrings; none means no warning
	}{
		{"loopback no auth", &server.Options{Host: "127.0.0.1"}, nil},
		{"ipv6 loopback", &server.Options{Host: "::1"}, nil},
		{"localhost", &server.Options{Host: "localhost"}, nil},
		{"default host is every interface", &server.Options{}, []string{"NO authentication", "0.0.0.0:4222", "without TLS"}},
		{"exposed no auth", &server.Options{Host: "0.0.0.0", Port: 4222}, []string{"NO authentication"}},
		{"exposed token", &server.Options{Host: "10.0.0.1", Authorization: "t"}, []string{"without TLS"}},
		{"exposed with shipped users", withHost(shipped, "0.0.0.0"), []string{"without TLS"}},
		{"no_auth_user", &server.Options{Host: "0.0.0.0", Users: []*server.User{{Username: "u"}}, NoAuthUser: "u"}, []string{"no_auth_user"}},
		{"monitoring exposed", &server.Options{Host: "127.0.0.1", HTTPHost: "0.0.0.0", HTTPPort: 8222}, []string{"monitoring"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CheckExposure(tt.opts)
			if len(tt.want) == 0 {
				if got != "" {
					t.Fatalf("warning %q, want none", got)
				}
				return
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("warning %q lacks %q", got, w)
				}
			}
			if tt.name == "exposed with shipped users" && strings.Contains(got, "NO authentication") {
				t.Errorf("shipped config counted as unauthenticated: %q", got)
			}
		})
	}
}

func withHost(o *server.Options, host string) *server.Options {
	c := o.Clone()
	c.Host = host
	return c
}

// TestPDPairedQueues: PD agents pull and hand off on the queues of their
// pairing (sy.jobs.<model>.<pool>.<pair>, subjects.PDJobs), and a prefill
// agent pulls its directed queue beside its pairing's shared one
// (prefix-cache affinity); the shipped configuration allows exactly that.
func TestPDPairedQueues(t *testing.T) {
	s := runShipped(t)
	b := connectAs(t, s, "broker-1")
	p := connectAs(t, s, "agent-prefill")
	d := connectAs(t, s, "agent-decode")
	ensureStream(t, b)
	subj := subjects.Must(subjects.DefaultPrefix)
	pair := subjects.PairKey("vllm", "")
	pdConsumer := func(t *testing.T, pool string) jetstream.ConsumerConfig { return pdConsumerConfig(t, "m", pool) }
	pcons, err := p.js.CreateOrUpdateConsumer(ctxT(t), stream, pdConsumer(t, subjects.PoolPrefill))
	if err != nil {
		t.Fatalf("prefill consumer of its pairing: %v", err)
	}
	directed := pdConsumer(t, subjects.PoolPrefill)
	directed.Durable, _ = subjects.DirectedConsumerName("m", subjects.PoolPrefill, pair, "p1")
	directed.FilterSubject, _ = subj.Directed("m", subjects.PoolPrefill, pair, "p1")
	dircons, err := p.js.CreateOrUpdateConsumer(ctxT(t), subjects.DirectedStream(stream), directed)
	if err != nil {
		t.Fatalf("prefill agent's directed consumer: %v", err)
	}
	dcons, err := d.js.CreateOrUpdateConsumer(ctxT(t), stream, pdConsumer(t, subjects.PoolDecode))
	if err != nil {
		t.Fatalf("decode consumer of its pairing: %v", err)
	}
	// The broker offers a prefill job on either queue; the prefill agent
	// takes it and hands off to its pairing's decode queue.
	for _, to := range []string{pdConsumer(t, subjects.PoolPrefill).FilterSubject, directed.FilterSubject} {
		if _, err := b.js.Publish(ctxT(t), to, []byte("prefill-job")); err != nil {
			t.Fatalf("broker publishes to %s: %v", to, err)
		}
	}
	for _, c := range []jetstream.Consumer{pcons, dircons} {
		msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("prefill fetch: %v", err)
		}
		if err := msg.DoubleAck(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	decodeSubj := pdConsumer(t, subjects.PoolDecode).FilterSubject
	if _, err := p.js.Publish(ctxT(t), decodeSubj, []byte("decode-job")); err != nil {
		t.Fatalf("prefill publishes to %s: %v", decodeSubj, err)
	}
	msg, err := dcons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("decode fetch: %v", err)
	}
	if err := msg.DoubleAck(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// Still nothing into the prefill queues from a prefill agent.
	prefillSubj := pdConsumer(t, subjects.PoolPrefill).FilterSubject
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := p.js.Publish(ctx, prefillSubj, []byte("forged")); err == nil {
		t.Errorf("prefill agent published to %s", prefillSubj)
	}
	p.denied(t, "Publish", prefillSubj)
}

// TestObserverPermissions: the operator's read-only user sees heartbeats,
// cancels and the queue's state, and nothing that carries a prompt or a
// reply or changes the stream.
func TestObserverPermissions(t *testing.T) {
	s := runShipped(t)
	b := connectAs(t, s, "broker-1")
	a := connectAs(t, s, "agent-regular")
	o := connectAs(t, s, "observer")
	ensureStream(t, b)
	cfg := consumerConfig(t, "m", subjects.PoolRegular)
	if _, err := a.js.CreateOrUpdateConsumer(ctxT(t), stream, cfg); err != nil {
		t.Fatal(err)
	}

	hb, err := o.nc.SubscribeSync("sy.hb.>")
	if err != nil {
		t.Fatal(err)
	}
	cancels, err := o.nc.SubscribeSync("sy.cancel.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.nc.Publish("sy.hb.m.regular.a1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	recv(t, hb)
	if err := b.nc.Publish("sy.cancel.r1", nil); err != nil {
		t.Fatal(err)
	}
	recv(t, cancels)

	st, err := o.js.Stream(ctxT(t), stream)
	if err != nil {
		t.Fatalf("observer stream info: %v", err)
	}
	var names []string
	lister := st.ConsumerNames(ctxT(t))
	for n := range lister.Name() {
		names = append(names, n)
	}
	if err := lister.Err(); err != nil {
		t.Fatalf("observer consumer names: %v", err)
	}
	if len(names) != 1 || names[0] != cfg.Durable {
		t.Errorf("consumer names = %v, want [%s]", names, cfg.Durable)
	}
	infos := st.ListConsumers(ctxT(t))
	for range infos.Info() {
	}
	if err := infos.Err(); err != nil {
		t.Fatalf("observer consumer list: %v", err)
	}
	if _, err := st.Consumer(ctxT(t), cfg.Durable); err != nil {
		t.Fatalf("observer consumer info: %v", err)
	}
	streams := o.js.StreamNames(ctxT(t))
	for range streams.Name() {
	}
	if err := streams.Err(); err != nil {
		t.Fatalf("observer stream names: %v", err)
	}
	streamInfos := o.js.ListStreams(ctxT(t))
	for range streamInfos.Info() {
	}
	if err := streamInfos.Err(); err != nil {
		t.Fatalf("observer stream list: %v", err)
	}
	if _, err := o.js.AccountInfo(ctxT(t)); err != nil {
		t.Fatalf("observer account info: %v", err)
	}

	t.Run("refused", func(t *testing.T) {
		o.deniedSubscribe(t, "sy.reply.>") // generated text
		o.deniedSubscribe(t, "sy.jobs.>")  // prompts and secrets
		o.deniedSubscribe(t, "sy.kv.>")
		o.deniedSubscribe(t, "_INBOX.broker-1.>")
		o.deniedSubscribe(t, "_INBOX.>")
		for _, subj := range []string{"sy.hb.m.regular.forged", "sy.cancel.r1", "sy.jobs.m.regular"} {
			if err := o.nc.Publish(subj, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			o.denied(t, "Publish", subj)
		}
		o.deniedRequest(t, "$JS.API.STREAM.MSG.GET."+stream, []byte(`{"seq":1}`))
		o.deniedRequest(t, "$JS.API.DIRECT.GET."+stream, []byte(`{"seq":1}`))
		o.deniedRequest(t, "$JS.API.STREAM.DELETE."+stream, nil)
		o.deniedRequest(t, "$JS.API.STREAM.PURGE."+stream, nil)
		o.deniedRequest(t, "$JS.API.STREAM.UPDATE."+stream, nil)
		o.deniedRequest(t, "$JS.API.CONSUMER.DELETE."+stream+"."+cfg.Durable, nil)
		o.deniedRequest(t, "$JS.API.CONSUMER.CREATE."+stream+".peek."+cfg.FilterSubject, []byte(`{}`))
		o.deniedRequest(t, "$JS.API.CONSUMER.MSG.NEXT."+stream+"."+cfg.Durable, []byte(`{"batch":1}`))
	})
}

// TestSystemUser: the system account's user gets the server-wide reports
// every server answers, and none of the requests that change a server.
func TestSystemUser(t *testing.T) {
	s := runShipped(t)
	c := connectAs(t, s, "sys")
	for _, subj := range []string{"$SYS.REQ.SERVER.PING", "$SYS.REQ.SERVER.PING.JSZ", "$SYS.REQ.SERVER.PING.VARZ"} {
		m, err := c.nc.Request(subj, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("sys: %s: %v", subj, err)
		}
		if !strings.Contains(string(m.Data), s.ID()) {
			t.Errorf("sys: %s answered %.200s, want this server's id", subj, m.Data)
		}
	}
	t.Run("refused", func(t *testing.T) {
		c.deniedSubscribe(t, "$SYS.>")
		c.deniedSubscribe(t, "_INBOX.observer.>")
		for _, op := range []string{"RELOAD", "KICK", "LDM", "VARZ"} {
			c.deniedRequest(t, "$SYS.REQ.SERVER."+s.ID()+"."+op, []byte(`{}`))
		}
	})
}
