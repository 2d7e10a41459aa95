//go:build unix

package h1

import (
	"errors"
	"net"
	"net/http"
	"syscall"
)

// sysRead is watchRaw's read(2) (a test counts its calls).
var sysRead = syscall.Read

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
				return false // the socket is empty: wait for the next bytes
			}
		}
	})
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
