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

// tryWrite makes one write(2) of b without waiting: the socket is
// non-blocking, so a full send buffer is EAGAIN, reported as n < len(b)
// with no error.
func tryWrite(rc syscall.RawConn, b []byte) (int, error) {
	var n int
	var errno error
	err := rc.Write(func(fd uintptr) bool {
		for {
			n, errno = syscall.Write(int(fd), b)
			if errno != syscall.EINTR {
				return true
			}
		}
	})
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
