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

// rawPump is pumpRaw's raw read callback and what it reports, made once
// per connection: a closure per answer cost four allocations.
type rawPump struct {
	s      *stream
	emit   agent.Emit
	result error
	ended  bool
	read   func(fd uintptr) bool
}

func (p *rawPump) finish(done bool, err error) bool {
	p.ended, p.result = done || p.emit == nil && p.s.feed.bodyDone, err
	return p.ended
}

// onReadable reads what the socket holds into the feed; true ends the
// raw read.
func (p *rawPump) onReadable(fd uintptr) bool {
	f, ec, emit := &p.s.feed, p.s.ec, p.emit
	for {
		n, errno := sysRead(int(fd), ec.buf)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN:
			return false
		case errno != nil:
			return p.finish(true, f.broken(emit, errno))
		case n == 0:
			return p.finish(true, f.eof(emit))
		}
		if p.finish(f.push(ec.buf[:n], emit)) {
			return true
		}
		if n < len(ec.buf) {
			return false // the socket is empty: wait for the next arrival
		}
	}
}

// pumpRaw is pump on the socket itself (see readSSE).
func (s *stream) pumpRaw(emit agent.Emit) error {
	p := &s.ec.pump
	if p.read == nil {
		p.read = p.onReadable
	}
	p.s, p.emit, p.result, p.ended = s, emit, nil, false
	err := s.ec.rc.Read(p.read)
	result, ended := p.result, p.ended
	p.s, p.emit, p.result = nil, nil, nil
	if err != nil && !ended {
		return s.feed.broken(emit, err)
	}
	return result
}
