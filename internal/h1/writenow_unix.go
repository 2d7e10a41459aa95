//go:build unix

package h1

import (
	"net"
	"syscall"
)

// rawOf returns the socket of a plain TCP connection, for WriteNow; nil
// for anything else (TLS: its records are written by crypto/tls).
func rawOf(c net.Conn) syscall.RawConn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// rawWriter makes FlushNow's write(2)s on a connection's socket. Its
// callback is made once per connection: a closure per write would cost
// three allocations (it, and the count and error it fills), and a stream
// writes once per token. One write at a time: a response's writes are its
// writer's (see FlushNow).
type rawWriter struct {
	b     []byte
	n     int
	errno error
	fn    func(fd uintptr) bool
}

func (w *rawWriter) write(fd uintptr) bool {
	for {
		w.n, w.errno = syscall.Write(int(fd), w.b)
		if w.errno != syscall.EINTR {
			return true
		}
	}
}

// tryWrite makes one write(2) of b without waiting: the socket is
// non-blocking, so a full send buffer is EAGAIN, reported as n < len(b)
// with no error.
func (w *rawWriter) tryWrite(rc syscall.RawConn, b []byte) (int, error) {
	if w.fn == nil {
		w.fn = w.write
	}
	w.b = b
	err := rc.Write(w.fn)
	n, errno := w.n, w.errno
	w.b, w.n, w.errno = nil, 0, nil
	if err != nil {
		return 0, err
	}
	if errno == syscall.EAGAIN {
		return 0, nil
	}
	if errno != nil {
		return 0, errno
	}
	return n, nil
}
