package grpcapi

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// openWatch opens a health Watch on conn and reads its first answer.
func openWatch(ctx context.Context, conn *grpc.ClientConn) error {
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	return err
}

// TestWatchBounds: health Watch streams are bounded per connection and in
// total, answer ResourceExhausted past either, and share one ticker.
func TestWatchBounds(t *testing.T) {
	cfg := Config{MaxWatches: WatchesPerConn + 2, HealthInterval: 10 * time.Millisecond}
	srv := New(&fakeBackend{}, cfg)
	one := serve(t, srv, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for i := range WatchesPerConn {
		if err := openWatch(ctx, one); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	err := openWatch(ctx, one)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "connection") {
		t.Fatalf("watch past the connection's bound: %v, want ResourceExhausted", err)
	}
	// Another connection to the same server takes what is left of the total.
	other, err := grpc.NewClient(strings.TrimPrefix(one.Target(), "dns:///"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	octx, ocancel := context.WithCancel(ctx)
	for i := range 2 {
		if err := openWatch(octx, other); err != nil {
			t.Fatalf("watch %d on another connection: %v", i, err)
		}
	}
	err = openWatch(ctx, other)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--grpc-max-watches") {
		t.Fatalf("watch past the total: %v, want ResourceExhausted", err)
	}
	if n := srv.health.openWatches(); n != cfg.MaxWatches {
		t.Fatalf("%d watches open, want %d", n, cfg.MaxWatches)
	}
	// Ended watches give their places back.
	ocancel()
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := srv.health.openWatches(); n != WatchesPerConn {
			return fmt.Errorf("%d watches open, want %d", n, WatchesPerConn)
		}
		return nil
	})
	if err := openWatch(ctx, other); err != nil {
		t.Fatalf("watch after others ended: %v", err)
	}
	cancel()
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		srv.health.mu.Lock()
		defer srv.health.mu.Unlock()
		if srv.health.watches != 0 || srv.health.stop != nil || len(srv.health.byConn) != 0 {
			return fmt.Errorf("%d watches, ticker running %v, %d connections counted", srv.health.watches, srv.health.stop != nil, len(srv.health.byConn))
		}
		return nil
	})
}

// TestHeaderListBound: a stream whose metadata is past MaxHeaderListSize
// is refused; the client learns the bound from the server's SETTINGS and
// refuses to send it.
func TestHeaderListBound(t *testing.T) {
	cfg := Config{MaxHeaderListSize: 4096}
	conn := serve(t, New(&fakeBackend{}, cfg), cfg)
	hc := healthpb.NewHealthClient(conn)
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	big := metadata.AppendToOutgoingContext(t.Context(), "x-big", strings.Repeat("x", 8000))
	if _, err := hc.Check(big, &healthpb.HealthCheckRequest{}); status.Code(err) == codes.OK {
		t.Fatal("8000 bytes of metadata accepted past a 4096-byte header list bound")
	}
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the connection after a refused stream: %v", err)
	}
}

// TestConcurrentStreamBound: past MaxConcurrentStreams a connection's
// further streams wait; they are served once one ends.
func TestConcurrentStreamBound(t *testing.T) {
	cfg := Config{MaxConcurrentStreams: 2}
	conn := serve(t, New(&fakeBackend{}, cfg), cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for i := range 2 {
		if err := openWatch(ctx, conn); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	short, scancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer scancel()
	if _, err := healthpb.NewHealthClient(conn).Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("third stream on a connection bound to 2: %v, want it to wait", err)
	}
	cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("after the streams ended: %v", err)
	}
}

// TestConnectionTimeouts: a connection that does not finish its HTTP/2
// handshake is closed after HandshakeTimeout, and one with no stream
// after IdleTimeout.
func TestConnectionTimeouts(t *testing.T) {
	cfg := Config{HandshakeTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(ServerOptions(cfg)...)
	New(&fakeBackend{}, cfg).Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	// closed reads c to its end and says how long that took; past 100
	// times the timeout the connection counts as left open.
	closed := func(c net.Conn, timeout time.Duration) time.Duration {
		t.Helper()
		at := time.Now()
		_ = c.SetReadDeadline(at.Add(100 * timeout))
		_, err := io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection still open after %s", time.Since(at))
		}
		return time.Since(at)
	}
	t.Run("handshake", func(t *testing.T) {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n") // half a preface
		t.Logf("closed %s after half a preface", closed(c, cfg.HandshakeTimeout).Round(time.Millisecond))
	})
	t.Run("idle", func(t *testing.T) {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The preface and an empty SETTINGS frame; then nothing. grpc-go
		// drains an idle connection with a GOAWAY and a ping, and closes
		// it once the ping is answered or after 5s: this client answers
		// nothing.
		_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
		t.Logf("closed %s after an idle handshake", closed(c, cfg.IdleTimeout).Round(time.Millisecond))
	})
}
