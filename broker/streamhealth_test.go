package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestReadyStreamUnusable: a jobs stream whose writes the server refuses
// (memory where the server has none left) makes Ready an error saying so,
// with JetStream's words and code, and the log names it once; when the
// stream is gone and made again, Ready recovers and the log says so.
func TestReadyStreamUnusable(t *testing.T) {
	opts := natstest.DefaultOptions(t)
	opts.JetStreamMaxMemory = 1
	s := natstest.RunServer(t, opts)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{"sy.jobs.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "sy.jobs.earlier", []byte("fills the memory")); err != nil {
		t.Fatal(err)
	}
	var logs testwait.Buffer
	b, err := New(nc, Config{HeartbeatInterval: 50 * time.Millisecond, FileStorage: true},
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(runCtx) }()
	defer func() { stop(); <-done }()

	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		err := b.Ready()
		if !errors.Is(err, ErrStreamUnusable) || !strings.Contains(err.Error(), "insufficient resources (JetStream error 10023)") {
			return fmt.Errorf("Ready() = %v, want the refused write", err)
		}
		return nil
	})
	if n := strings.Count(logs.String(), "jobs stream cannot take jobs"); n != 1 {
		t.Fatalf("the problem logged %d times, want once:\n%s", n, logs.String())
	}

	if err := js.DeleteStream(ctx, DefaultStream); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(logs.String(), "jobs stream takes jobs again") {
			return fmt.Errorf("no recovery logged:\n%s", logs.String())
		}
		return b.Ready()
	})
	st, err := js.Stream(ctx, DefaultStream)
	if err != nil || st.CachedInfo().Config.Storage != jetstream.FileStorage {
		t.Fatalf("stream made again: %v, want file storage", err)
	}
}
