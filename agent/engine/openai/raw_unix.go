//go:build unix

package openai

import (
	"net"
	"syscall"

	"github.com/switchyard-ai/switchyard/agent"
)

// rawConn returns c's socket for pumpRaw, or nil when c has none.
func rawConn(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// sysRead is the read(2) of pump (a test counts its calls).
var sysRead = syscall.Read

// pumpRaw is pump on the socket itself (see readSSE).
func (s *stream) pumpRaw(emit agent.Emit) error {
	f, ec := &s.feed, s.ec
	var result error
	ended := false
	finish := func(done bool, err error) bool {
		ended, result = done || emit == nil && f.bodyDone, err
		return ended
	}
	err := ec.rc.Read(func(fd uintptr) bool {
		for {
			n, errno := sysRead(int(fd), ec.buf)
			switch {
			case errno == syscall.EINTR:
				continue
			case errno == syscall.EAGAIN:
				return false
			case errno != nil:
				return finish(true, f.broken(emit, errno))
			case n == 0:
				return finish(true, f.eof(emit))
			}
			if finish(f.push(ec.buf[:n], emit)) {
				return true
			}
			if n < len(ec.buf) {
				return false // the socket is empty: wait for the next arrival
			}
		}
	})
	if err != nil && !ended {
		return f.broken(emit, err)
	}
	return result
}
