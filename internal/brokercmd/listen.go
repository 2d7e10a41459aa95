package brokercmd

import (
	"io"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-ai/switchyard/ingress/auth"
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

// refuseHTTP answers a plain HTTP connection refused by the connection
// limiter with one 503 and closes it, reading what the client sent
// meanwhile (within a second) so that the close does not reset the
// connection before the client read the answer. A TLS connection or a
// gRPC one cannot read a plain answer: refuseClose only closes it.
func refuseHTTP(c net.Conn, why auth.Refusal) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	answer := tooManyConns
	if why == auth.RefusedClient {
		answer = tooManyClientConns
	}
	if _, err := io.WriteString(c, answer); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

func refuseClose(c net.Conn, _ auth.Refusal) { _ = c.Close() }

// The answers to a connection past --max-conns, and past
// --max-conns-per-client.
var (
	tooManyConns       = refusal("the broker has as many connections open as --max-conns allows")
	tooManyClientConns = refusal("this client has as many connections open as --max-conns-per-client allows")
)

func refusal(message string) string {
	body := `{"error":{"message":"` + message + `","type":"server_error","param":null,"code":"too_many_connections"}}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}
