package brokercmd

import (
	"io"
	"net"
	"strconv"
	"sync"
	"time"

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

// limitListener keeps at most cap(open) connections open at once. Past
// it a connection gets one 503 (a plain TCP listener; TLS ones are
// closed) and is closed at once, so idle or slow sockets cannot exhaust
// the broker's memory and file descriptors, and a client past the limit
// gets an answer rather than a hang in the listen backlog.
type limitListener struct {
	net.Listener
	open chan struct{}
	// refusing bounds the goroutines that answer refused connections;
	// past it they are closed without an answer.
	refusing chan struct{}
	answer   bool // refused connections get a 503
}

func newLimitListener(ln net.Listener, max int, answer bool) *limitListener {
	return &limitListener{Listener: ln, open: make(chan struct{}, max), refusing: make(chan struct{}, 64), answer: answer}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.open <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.open }}, nil
		default:
		}
		if !l.answer {
			_ = c.Close()
			continue
		}
		select {
		case l.refusing <- struct{}{}:
			go func() {
				defer func() { <-l.refusing }()
				refuse(c)
			}()
		default:
			_ = c.Close()
		}
	}
}

// tooManyConns is the answer to a connection past --max-conns.
var tooManyConns = func() string {
	body := `{"error":{"message":"the broker has as many connections open as --max-conns allows","type":"server_error","param":null,"code":"too_many_connections"}}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// refuse answers a connection past the limit with a 503 and closes it,
// reading what the client sent meanwhile (within a second) so that the
// close does not reset the connection before the client read the answer.
func refuse(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, tooManyConns); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// limitConn gives its slot back once, when closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
