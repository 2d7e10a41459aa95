//go:build unix

package h1

import (
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"
)

// readHook, when set, is watchRaw's read(2) (a test counts its calls);
// atomic, as a connection of an earlier test may still be reading.
var readHook atomic.Pointer[func(int, []byte) (int, error)]

func sysRead(fd int, p []byte) (int, error) {
	if h := readHook.Load(); h != nil {
		return (*h)(fd, p)
	}
	return syscall.Read(fd, p)
}

// watchRaw is watch on a plain TCP connection's socket, and goes on for as
// long as the client's requests come whole, one after another's response
// (the usual kept-alive client). It hands req to the handler and waits for
// the client's next bytes inside one raw read of the socket, and hands
// every next request that arrives whole to the handler from there.
//
// Inside one raw read the runtime's poller keeps every readiness reported
// since it began, so a read that came back short (the socket emptied) is
// followed by a wait, not by another read: one read(2) per request, where
// watch, through net.Conn.Read, makes two (the first finds nothing). A
// wait in a new raw read could miss bytes that came before it began (its
// start resets the readiness), which is why the request goes to the
// handler inside it: its response, and so the client's next request,
// cannot come before.
//
// A short read proves the socket held no more bytes, but not that the
// client did not end the connection: its end (FIN) can come in the same
// readiness report as its request, while the woken reader waits to run,
// and the read that takes the request does not report it. A request
// handed on after such a read is therefore checked once, probeAfter
// later, if it still runs then (see probe): a client that went away as
// it sent its request has it cancelled within that bound, and a request
// shorter than the bound costs no read for it.
//
// Anything else (a request not whole in the buffer, pipelined requests, a
// full read, a request for net/http) ends the raw read, and the serve
// loop goes on as with watch. It reports whether the connection may go
// on, and handoff when it goes to net/http from buf[r:] on.
func (c *conn) watchRaw(req *http.Request) (goOn, handoff bool) {
	if c.r < len(c.buf) {
		// Pipelined: the next request is here already.
		c.state.Store(connServing)
		c.reqs <- req
		return c.watch(), false
	}
	if c.peek == nil {
		c.peek = make([]byte, 4096)
	}
	handed, gone := false, false
	err := c.rc.Read(func(fd uintptr) bool {
		c.stopProbe() // any end of the client's is read now
		if !handed {
			handed = true
			c.state.Store(connServing)
			c.reqs <- req
		}
		for {
			n, errno := sysRead(int(fd), c.peek)
			switch {
			case errno == syscall.EINTR:
				continue
			case errno == syscall.EAGAIN:
				return false // wait for the next bytes
			case errno != nil || n == 0:
				gone = true // the client went away, or broke the connection
				return true
			}
			c.state.Store(connReading)
			<-c.done
			c.compact()
			c.buf = append(c.buf, c.peek[:n]...)
			if c.closeAfter || c.srv.shutting.Load() {
				return true
			}
			next, off, err := c.next(true)
			if err != nil || off {
				// Not whole yet, or net/http's: the serve loop reads
				// on, or hands the connection over.
				goOn, handoff = true, off
				return true
			}
			c.state.Store(connServing)
			c.reqs <- next
			if c.r < len(c.buf) {
				// Pipelined: the next request's turn comes when this
				// one's response is out.
				<-c.done
				goOn = true
				return true
			}
			if n < len(c.peek) {
				// The socket is empty: wait for the next bytes, and
				// make sure of the client's end if the request runs on.
				c.armProbe()
				return false
			}
		}
	})
	c.stopProbe()
	if !handed {
		// The raw read could not start (the connection closed, or its
		// deadline passed): watch meets the same end.
		c.state.Store(connServing)
		c.reqs <- req
		return c.watch(), false
	}
	if err == nil && !gone {
		return goOn, handoff
	}
	// A wait that ended (the idle deadline, or Close) or a read that found
	// the client gone, while a handler may run: as in watch.
	var ne net.Error
	if gone || !(errors.As(err, &ne) && ne.Timeout()) || !c.handlerIdle() {
		c.cancel()
	}
	<-c.done
	return false, false
}

// probeAfter is how long a request handed on after a short read runs
// before the reader checks once that its client is still there (see
// watchRaw): within the broker's bound for cancelling a request whose
// client went away (100 ms), and longer than a short request.
const probeAfter = 50 * time.Millisecond

// probeAfterTest, when set, replaces probeAfter (a test shortens it;
// atomic, as a connection of an earlier test may still arm its probe).
var probeAfterTest atomic.Int64

func (c *conn) armProbe() {
	d := probeAfter
	if t := probeAfterTest.Load(); t > 0 {
		d = time.Duration(t)
	}
	if c.probe == nil {
		c.probe = time.AfterFunc(d, c.probeGone)
		return
	}
	c.probe.Reset(d)
}

func (c *conn) stopProbe() {
	if c.probe != nil {
		c.probe.Stop()
	}
}

// probeGone looks at the client's socket without taking its bytes: when
// the client ended the connection (or broke it), it wakes the reader
// with a deadline in the past, and the reader cancels the running
// request as it would have on reading the end. It runs on the probe's
// timer, beside the reader's wait.
func (c *conn) probeGone() {
	gone := false
	_ = c.rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
			case err != nil || n == 0:
				gone = true
			}
			return
		}
	})
	if gone {
		_ = c.nc.SetReadDeadline(longAgo)
	}
}

// longAgo is a deadline in the past: it wakes a blocked read at once.
var longAgo = time.Unix(1, 0)
