package brokercmd

import (
	"net"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-ai/switchyard/internal/cli"
)

// checkEmbeddedPorts tells a taken client or monitoring port of the
// embedded NATS server before it starts: nats-server listens in its own
// goroutine and, with logging off, a taken port only shows as a server that
// never becomes ready. Random ports (-1, 0) cannot be taken.
func checkEmbeddedPorts(opts *server.Options, clientFlag string) error {
	if opts.Port > 0 {
		addr := net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port))
		if err := cli.CheckFree("embedded NATS (client port for agents)", addr, clientFlag); err != nil {
			return err
		}
	}
	if opts.HTTPPort > 0 {
		addr := net.JoinHostPort(opts.HTTPHost, strconv.Itoa(opts.HTTPPort))
		if err := cli.CheckFree("embedded NATS monitoring", addr, "nats-monitor"); err != nil {
			return err
		}
	}
	return nil
}
