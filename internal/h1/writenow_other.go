//go:build !unix

package h1

import (
	"net"
	"syscall"
)

// rawOf returns nil: WriteNow always leaves the write to the handler.
func rawOf(net.Conn) syscall.RawConn { return nil }

func tryWrite(syscall.RawConn, []byte) (int, error) { return 0, nil }
