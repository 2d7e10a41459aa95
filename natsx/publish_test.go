package natsx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/natsx"
)

// restartable is a JetStream server on a fixed port and store, and a
// connection to it that reconnects for ever.
type restartable struct {
	t    *testing.T
	opts server.Options
	s    *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
}

func newRestartable(t *testing.T) *restartable {
	t.Helper()
	opts := natstest.DefaultOptions(t)
	opts.Port = natstest.FreePort(t)
	r := &restartable{t: t, opts: *opts}
	r.start()
	nc, err := nats.Connect(r.s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r.nc = nc
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *restartable) start() {
	opts := r.opts
	r.s = natstest.RunServer(r.t, &opts)
}

// stop shuts the server down and waits until the connection sees it.
func (r *restartable) stop() {
	r.s.Shutdown()
	r.s.WaitForShutdown()
	testwait.For(r.t, 10*time.Second, 5*time.Millisecond, func() error {
		if r.nc.IsConnected() {
			return errors.New("still connected")
		}
		return nil
	})
}

func TestAwaitConnected(t *testing.T) {
	r := newRestartable(t)
	if !natsx.AwaitConnected(t.Context(), r.nc) {
		t.Fatal("a connected connection is not connected")
	}
	r.stop()

	ended, cancel := context.WithCancel(t.Context())
	cancel()
	if natsx.AwaitConnected(ended, r.nc) {
		t.Fatal("connected while the server is down")
	}

	got := make(chan bool, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() { got <- natsx.AwaitConnected(ctx, r.nc) }()
	r.start()
	if !<-got {
		t.Fatal("not connected after the server came back")
	}

	r.nc.Close()
	if natsx.AwaitConnected(ctx, r.nc) {
		t.Fatal("a closed connection is connected")
	}
}

// TestPublish stores a message through a server restart, once whatever
// the tries; a full queue is answered at the first try.
func TestPublish(t *testing.T) {
	r := newRestartable(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	st, err := r.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "J", Subjects: []string{"j.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
		Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, MaxMsgsPerSubject: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	retry := natsx.Retry{Try: time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}

	r.stop()
	retried := 0
	restarting := retry
	restarting.Retrying = func(err error, _ time.Duration) {
		if !natsx.NotNow(err) {
			t.Errorf("tried again after %v", err)
		}
		if retried++; retried == 1 {
			r.start() // the server comes back while the publish waits
		}
	}
	ack, tries, err := natsx.Publish(ctx, r.js, "j.a", []byte("job"), "m1", restarting)
	if err != nil {
		t.Fatalf("publish across a restart: %v", err)
	}
	if tries < 2 || tries != retried+1 {
		t.Fatalf("%d tries, %d retried: want a try before the restart, and a callback per try again", tries, retried)
	}
	again, _, err := natsx.Publish(ctx, r.js, "j.a", []byte("job"), "m1", retry)
	if err != nil || !again.Duplicate || again.Sequence != ack.Sequence {
		t.Fatalf("the same id again: %+v %v, want a duplicate of %d", again, err, ack.Sequence)
	}

	counting := retry
	counting.Retrying = func(error, time.Duration) { t.Error("a full queue was tried again") }
	_, tries, err = natsx.Publish(ctx, r.js, "j.a", []byte("job"), "m2", counting)
	if !natsx.QueueFull(err) || tries != 1 {
		t.Fatalf("full queue: %v after %d tries, want QueueFull at once", err, tries)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream holds %+v (%v), want 1 message", info, err)
	}
}

// TestPublishGivesUp: a publish that never finds a stream ends with ctx,
// with the last try's error.
func TestPublishGivesUp(t *testing.T) {
	r := newRestartable(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, tries, err := natsx.Publish(ctx, r.js, "nowhere", []byte("job"), "m1",
		natsx.Retry{Try: 100 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err == nil || !natsx.NotNow(err) || tries < 2 {
		t.Fatalf("%v after %d tries, want a not-now error after tries again", err, tries)
	}
}
