//go:build unix

package h1

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// countReads counts watchRaw's read(2) calls, and those that found the
// socket empty, for the rest of the test.
func countReads(t *testing.T) (calls, empty *atomic.Int64) {
	calls, empty = new(atomic.Int64), new(atomic.Int64)
	read := func(fd int, p []byte) (int, error) {
		n, err := syscall.Read(fd, p)
		calls.Add(1)
		if err == syscall.EAGAIN {
			empty.Add(1)
		}
		return n, err
	}
	readHook.Store(&read)
	t.Cleanup(func() { readHook.Store(nil) })
	return calls, empty
}

// TestOneReadPerRequest: a kept-alive client's requests, each sent after
// the last answer, cost the reader one read(2) each, not a second one
// that finds the socket empty (what net.Conn.Read makes first), and every
// one is answered in order.
func TestOneReadPerRequest(t *testing.T) {
	const requests = 100
	_, addr := testServer(t, echo)
	calls, empty := countReads(t)
	c, br := raw(t, addr)
	for i := range requests {
		body := fmt.Sprintf(`{"n":%d}`, i)
		fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		if resp, got := readResp(t, br); got != "POST /fast "+body || resp.Header.Get("X-Served-By") != "h1" {
			t.Fatalf("request %d: %q by %q", i, got, resp.Header.Get("X-Served-By"))
		}
	}
	// The first request came through fill; each later one through
	// watchRaw's reads. A readiness report for bytes a read already took
	// costs an empty read now and then.
	if n := calls.Load(); n < requests-1 {
		t.Fatalf("%d raw reads for %d requests: the reader did not watch in its raw read", n, requests)
	}
	if e := empty.Load(); e > requests/10+1 {
		t.Fatalf("%d of %d reads found the socket empty, for %d requests", e, calls.Load(), requests)
	}
}

// TestKeptAliveIdleTimeoutAndLongRequest: inside the raw read a request
// longer than one read and an idle connection are handled as before: the
// request is answered, and the idle connection closed.
func TestKeptAliveIdleTimeoutAndLongRequest(t *testing.T) {
	_, addr := testServer(t, echo, func(s *Server) { s.IdleTimeout = 100 * time.Millisecond })
	c, br := raw(t, addr)
	for i, body := range []string{"{}", "{}", `"` + strings.Repeat("x", 20<<10) + `"`, "{}"} {
		fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		if _, got := readResp(t, br); got != "POST /fast "+body {
			t.Fatalf("request %d: %d bytes back, want %d", i, len(got), len("POST /fast "+body))
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want the server to close it", err)
	}
}

// TestKeptAliveShutdown: Shutdown closes a kept-alive connection that
// waits, idle, inside the raw read, and a later request for net/http on
// such a connection is handed over.
func TestKeptAliveShutdown(t *testing.T) {
	s, addr := testServer(t, echo)
	c, br := raw(t, addr)
	for range 3 {
		fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		readResp(t, br)
	}
	fmt.Fprintf(c, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, got := readResp(t, br); resp.Header.Get("X-Served-By") != "fallback" || got != "GET /other 0" {
		t.Fatalf("a request for net/http: %q by %q", got, resp.Header.Get("X-Served-By"))
	}
	c2, br2 := raw(t, addr)
	for range 3 {
		fmt.Fprintf(c2, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		readResp(t, br2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br2.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection at shutdown: %v, want EOF", err)
	}
}
