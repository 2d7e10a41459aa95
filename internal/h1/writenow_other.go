//go:build !unix

package h1

import (
	"net"
	"net/http"
	"syscall"
)

// rawOf returns nil: WriteNow always leaves the write to the handler.
func rawOf(net.Conn) syscall.RawConn { return nil }

// rawWriter is not used here: rawOf returns nil.
type rawWriter struct{}

func (*rawWriter) tryWrite(syscall.RawConn, []byte) (int, error) { return 0, nil }

// watchRaw is not used here: rawOf returns nil.
func (c *conn) watchRaw(*http.Request) (bool, bool) { panic("h1: watchRaw without a raw connection") }
