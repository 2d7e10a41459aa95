package cli

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Listen opens a TCP listener on addr for what (e.g. "HTTP API"). When the
// address is taken, the error says which address, and which flag moves it,
// instead of the bare "bind: address already in use".
func Listen(what, addr, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, ListenError(what, addr, flag, err)
	}
	return ln, nil
}

// ListenError explains a failure to listen on addr for what.
func ListenError(what, addr, flag string, err error) error {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%s: address %s is already in use (another broker or agent, or another program, listens there); choose another with --%s: %w", what, addr, flag, err)
	case errors.Is(err, syscall.EACCES):
		return fmt.Errorf("%s: no permission to listen on %s (ports below 1024 need privileges); choose another with --%s: %w", what, addr, flag, err)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return fmt.Errorf("%s: address %s is not on this host; choose another with --%s: %w", what, addr, flag, err)
	}
	return fmt.Errorf("%s: listen on %s (--%s): %w", what, addr, flag, err)
}

// CheckFree reports, as ListenError does, whether addr can be listened on
// now, for servers that listen in the background and would only time out
// (the embedded nats-server). The port may still be taken between this
// check and the server's own listen; that rare race ends in the server's
// own, vaguer error.
func CheckFree(what, addr, flag string) error {
	ln, err := Listen(what, addr, flag)
	if err != nil {
		return err
	}
	return ln.Close()
}
