package natsx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/natsx"
)

// The codes named here are the server's.
func TestCodesAreTheServers(t *testing.T) {
	for _, tc := range []struct {
		name string
		ours jetstream.ErrorCode
		id   server.ErrorIdentifier
	}{
		{"cluster not available", natsx.CodeClusterNotAvail, server.JSClusterNotAvailErr},
		{"store failed", natsx.CodeStreamStoreFailed, server.JSStreamStoreFailedF},
	} {
		if got := server.ApiErrors[tc.id].ErrCode; uint16(tc.ours) != got {
			t.Errorf("%s: %d, the server's is %d", tc.name, tc.ours, got)
		}
	}
}

// Errors as a real server and nats.go's jetstream produce them, where a
// single server can produce them; the others as jetstream reports them.
func TestClassify(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "J", Subjects: []string{"j.>"}, Retention: jetstream.WorkQueuePolicy,
		Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, MaxMsgsPerSubject: 1,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "j.full", []byte("job")); err != nil {
		t.Fatal(err)
	}
	_, full := js.Publish(ctx, "j.full", []byte("job"))
	_, noStream := js.Publish(ctx, "elsewhere", []byte("job"), jetstream.WithRetryAttempts(0))
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, timeout := js.Publish(expired, "j.t", []byte("job"))
	closedNC, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	closedJS, err := jetstream.New(closedNC)
	if err != nil {
		t.Fatal(err)
	}
	closedNC.Close()
	_, closed := closedJS.Publish(ctx, "j.c", []byte("job"))
	_, badStream := js.Stream(ctx, "no-such-stream")

	// A server without JetStream.
	plain := natstest.DefaultOptions(t)
	plain.JetStream = false
	pnc, err := nats.Connect(natstest.RunServer(t, plain).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pnc.Close()
	pjs, err := jetstream.New(pnc)
	if err != nil {
		t.Fatal(err)
	}
	_, notEnabled := pjs.AccountInfo(ctx)

	for _, tc := range []struct {
		name      string
		err       error
		notNow    bool
		queueFull bool
	}{
		{"queue full", full, false, true},
		{"no stream answers", noStream, true, false},
		{"try timed out", timeout, true, false},
		{"connection closed", closed, false, false},
		{"stream not found", badStream, false, false},
		{"JetStream not enabled", notEnabled, true, false},
		{"leader election", fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: natsx.CodeClusterNotAvail, Description: "JetStream system temporarily unavailable"}), true, false},
		{"reconnecting", nats.ErrConnectionReconnecting, true, false},
		{"disconnected", nats.ErrDisconnected, true, false},
		{"request timeout", nats.ErrTimeout, true, false},
		{"other API error", fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest}), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("no error produced")
			}
			if got := natsx.NotNow(tc.err); got != tc.notNow {
				t.Errorf("NotNow(%v) = %v, want %v", tc.err, got, tc.notNow)
			}
			if got := natsx.QueueFull(tc.err); got != tc.queueFull {
				t.Errorf("QueueFull(%v) = %v, want %v", tc.err, got, tc.queueFull)
			}
		})
	}
}
