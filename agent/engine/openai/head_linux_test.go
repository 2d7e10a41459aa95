package openai

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// inqConn counts the reads of its connection that start while nothing is
// waiting in the socket's receive queue: the reads that come back EAGAIN
// and park (what net.Conn.Read does when nothing has come yet).
type inqConn struct {
	*net.TCPConn
	reads, empty *atomic.Int64
}

func (c *inqConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			var n int32
			const fionread = 0x541B // Linux's FIONREAD (TIOCINQ)
			if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, fionread, uintptr(unsafe.Pointer(&n))); e == 0 && n == 0 {
				c.empty.Add(1)
			}
		})
	}
	return c.TCPConn.Read(p)
}

// TestAnswerHeadWaited: the adapter sends a request and waits for the
// engine's answer before it reads, so reading an answer's head does not
// start with a read(2) that finds nothing, one per engine request. The
// requests go one after another on one kept-alive connection, and every
// answer arrives whole.
func TestAnswerHeadWaited(t *testing.T) {
	const streams = 40
	srv, conns := sseServer(t, 1, 0, time.Minute, nil)
	a, err := New(srv.URL, 2)
	if err != nil {
		t.Fatal(err)
	}
	var reads, empty atomic.Int64
	d := &net.Dialer{}
	a.conns.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &inqConn{TCPConn: c.(*net.TCPConn), reads: &reads, empty: &empty}, nil
	}
	for i := range streams {
		// The engine is slower than the adapter's read would be: it has
		// to read the request and run its handler first.
		text, err := streamText(context.Background(), a)
		if err != nil || !strings.Contains(text, " t0") {
			t.Fatalf("stream %d: %q, %v", i, text, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d streams used %d connections, want 1", streams, n)
	}
	if reads.Load() < streams {
		t.Fatalf("%d reads of the connection for %d answers' heads", reads.Load(), streams)
	}
	// A readiness report left from the answer before can wake the wait
	// early now and then.
	if e := empty.Load(); e > streams/4 {
		t.Fatalf("%d of %d reads of an answer's head found nothing to read, for %d answers", e, reads.Load(), streams)
	}
}
