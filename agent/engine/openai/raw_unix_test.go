//go:build unix

package openai

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// countEngineReads counts pump's read(2) calls, and those that found the
// socket empty, for the rest of the test.
func countEngineReads(t *testing.T) (calls, empty *atomic.Int64) {
	calls, empty = new(atomic.Int64), new(atomic.Int64)
	sysRead = func(fd int, p []byte) (int, error) {
		n, err := syscall.Read(fd, p)
		calls.Add(1)
		if err == syscall.EAGAIN {
			empty.Add(1)
		}
		return n, err
	}
	t.Cleanup(func() { sysRead = syscall.Read })
	return calls, empty
}

// TestStreamOneReadPerToken: tokens that arrive one at a time cost the
// adapter one read(2) each on its own connections, not a second one that
// finds the socket empty (what net.Conn.Read makes), and all arrive.
func TestStreamOneReadPerToken(t *testing.T) {
	const tokens = 40
	srv, _ := sseServer(t, tokens, 2*time.Millisecond, time.Minute, nil)
	a, err := New(srv.URL, 4)
	if err != nil {
		t.Fatal(err)
	}
	calls, empty := countEngineReads(t)
	text, err := streamText(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(text, "\n"); n != tokens {
		t.Fatalf("%d events, want %d", n, tokens)
	}
	for i := range tokens {
		if !strings.Contains(text, fmt.Sprintf(" t%d\"", i)) {
			t.Fatalf("token %d missing from %q", i, text)
		}
	}
	// A wake-up for data an earlier read took costs an empty read now and
	// then; net.Conn.Read pays one per token.
	if e := empty.Load(); e > tokens/4 {
		t.Fatalf("%d of %d engine reads found the socket empty, for %d tokens", e, calls.Load(), tokens)
	}
}
