//go:build !unix

package openai

import (
	"net"
	"syscall"

	"github.com/switchyard-ai/switchyard/agent"
)

// rawConn returns nil: pump reads through net.Conn here.
func rawConn(net.Conn) syscall.RawConn { return nil }

func (s *stream) pumpRaw(emit agent.Emit) error { return s.pumpConn(emit) }

// rawPump is not used here: rawConn returns nil.
type rawPump struct{}
