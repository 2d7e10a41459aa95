// Package natstest starts embedded nats-servers for tests: one JetStream
// server on a random loopback port with a temporary store, stopped when the
// test ends, in the manner of nats-server's RunBasicJetStreamServer, or a
// JetStream cluster on loopback (RunCluster) modelled on its
// createJetStreamClusterExplicit.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultOptions are the options of a test server: loopback, random port,
// JetStream on with its store in a test temp dir, no logs, no signals.
func DefaultOptions(t testing.TB) *server.Options {
	return &server.Options{
		Host:       "127.0.0.1",
		Port:       -1,
		NoLog:      true,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		MaxPayload: 8 << 20,
	}
}

// RunServer starts a server with opts and stops it at test cleanup.
func RunServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("natstest: server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// RunJetStream starts a default JetStream server.
func RunJetStream(t testing.TB) *server.Server {
	return RunServer(t, DefaultOptions(t))
}
