package h1

import (
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// onlyConn returns the one connection s serves.
func onlyConn(t *testing.T, s *Server) *conn {
	t.Helper()
	var only *conn
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.conns) != 1 {
			return fmt.Errorf("%d connections served, want 1", len(s.conns))
		}
		for c := range s.conns {
			only = c
		}
		return nil
	})
	return only
}

// peerEnded reports whether c's socket has received the client's end: its
// TCP state (tcp_info's first byte) is CLOSE_WAIT.
func peerEnded(c *conn) bool {
	const tcpCloseWait = 8
	ended := false
	_ = c.rc.Control(func(fd uintptr) {
		var info [256]byte
		n := uint32(len(info))
		_, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
		ended = e == 0 && info[0] == tcpCloseWait
	})
	return ended
}

// TestProbeFindsClientGone: a client whose end (FIN) comes in the same
// readiness report as its request (both arrived while the reader was
// busy) has the request cancelled all the same: the read that takes the
// request does not report the end, and no later readiness comes, so the
// reader's probe finds it. The client half-closes, as one that leaves
// would, and reads on.
func TestProbeFindsClientGone(t *testing.T) {
	probeAfterTest.Store(int64(20 * time.Millisecond))
	t.Cleanup(func() { probeAfterTest.Store(0) })
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	cancelled := make(chan struct{}, 1)
	s, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Mode") {
		case "hold":
			held <- struct{}{}
			<-hold
		case "wait":
			<-r.Context().Done()
			cancelled <- struct{}{}
			return
		}
		echo(w, r)
	})
	c, br := raw(t, addr)
	send := func(mode string) {
		fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nX-Mode: %s\r\nContent-Length: 2\r\n\r\n{}", mode)
	}
	send("")
	readResp(t, br) // the reader now serves from its raw read
	sc := onlyConn(t, s)
	send("hold")
	<-held
	// The reader takes the next request and waits for the held one's
	// end, busy (bytes of a next request read: connReading): what comes
	// now arrives in one readiness report.
	send("")
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if sc.state.Load() != connReading {
			return fmt.Errorf("the reader has not read the third request")
		}
		return nil
	})
	send("wait")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The request and the end behind it are in the server's socket.
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if !peerEnded(sc) {
			return fmt.Errorf("the client's end has not reached the server's socket")
		}
		return nil
	})
	close(hold)
	readResp(t, br)
	readResp(t, br)
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the request of a client that left as it sent it was not cancelled")
	}
}
