package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrNATSNotConnected is what NATSLink.Err returns while the connection is
// down and no dial has yet said why.
var ErrNATSNotConnected = errors.New("not connected to NATS")

// NATSLink keeps a command's NATS connection alive and says why it is not.
//
// nats.go reconnects on its own, but it tells little while it does: a
// refused password, a certificate it cannot verify or a server that wants
// TLS show up only as "not connected". While the connection is down,
// NATSLink dials the same URL with the same credentials once in a while,
// without retries, and keeps the error the server or the TLS stack gave, so
// the log, /readyz and the fleet view can name it. The connection itself
// never gives up: an authorization or TLS failure is retried like any other,
// so fixing the server or the credentials brings the process back.
type NATSLink struct {
	log  *slog.Logger
	name string

	mu      sync.Mutex
	lastErr error  // why the connection is down; nil while connected
	logged  string // lastErr as last logged, so a repeated failure logs once

	closeOnce sync.Once
	closed    chan struct{} // closed when the connection is closed for good

	asyncMu   sync.Mutex
	asyncSeen map[string]time.Time // async error text -> when it was last logged
}

// NewNATSLink returns a link for the connection named name (the client
// name the NATS server shows).
func NewNATSLink(log *slog.Logger, name string) *NATSLink {
	return &NATSLink{log: log, name: name, closed: make(chan struct{}), asyncSeen: map[string]time.Time{}}
}

// Options are the connection options both commands use: reconnect forever
// (a NATS restart, a cluster failover, a credential or certificate fixed on
// the server must not need a restart of a broker or an agent), quickly at
// first and then backing off, and say so through the logger.
func (l *NATSLink) Options() []nats.Option {
	return []nats.Option{
		nats.Name(l.name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		// By default nats.go closes the connection for good when a server
		// refuses the same credentials twice: a slip fixed on the server
		// would then need every process restarted.
		nats.IgnoreAuthErrorAbort(),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.ConnectHandler(func(c *nats.Conn) { l.connected(c) }),
		nats.ReconnectHandler(func(c *nats.Conn) { l.connected(c) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				l.log.Warn("NATS disconnected", "conn", l.name, "err", err)
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			l.closeOnce.Do(func() { close(l.closed) })
			l.log.Debug("NATS connection closed", "conn", l.name)
		}),
		nats.ErrorHandler(l.asyncError),
	}
}

// reconnectDelay is the wait after attempts failed rounds over the server
// list: fast for a failover, then every few seconds for a server that stays
// away or refuses the client.
func reconnectDelay(attempts int) time.Duration {
	d := 250 * time.Millisecond
	for i := 1; i < attempts && d < 4*time.Second; i++ {
		d *= 2
	}
	return min(d, 4*time.Second)
}

func (l *NATSLink) connected(c *nats.Conn) {
	l.mu.Lock()
	was := l.lastErr
	l.lastErr, l.logged = nil, ""
	l.mu.Unlock()
	if was != nil {
		l.log.Info("NATS connected", "conn", l.name, "url", c.ConnectedUrlRedacted(), "after", was.Error())
		return
	}
	l.log.Info("NATS connected", "conn", l.name, "url", c.ConnectedUrlRedacted())
}

// asyncError logs what the server or the client reports outside any call
// (a permission violation, a slow consumer) as one structured line, and
// the same error again at most once a minute.
func (l *NATSLink) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if err == nil {
		return
	}
	key := err.Error()
	now := time.Now()
	l.asyncMu.Lock()
	last, seen := l.asyncSeen[key]
	if !seen || now.Sub(last) >= time.Minute {
		l.asyncSeen[key] = now
		if len(l.asyncSeen) > 64 {
			for k, t := range l.asyncSeen {
				if now.Sub(t) >= time.Minute {
					delete(l.asyncSeen, k)
				}
			}
		}
	}
	l.asyncMu.Unlock()
	if seen && now.Sub(last) < time.Minute {
		return
	}
	attrs := []any{"conn", l.name, "err", err}
	if sub != nil {
		attrs = append(attrs, "subject", sub.Subject)
	}
	if errors.Is(err, nats.ErrPermissionViolation) {
		l.log.Error("NATS permission violation: this user may not use the subject; check the role's permissions in the NATS config", attrs...)
		return
	}
	l.log.Warn("NATS error", attrs...)
}

// Err returns nil while nc is connected, else why it is not, in the
// server's or the TLS stack's words once a dial has said.
func (l *NATSLink) Err(nc *nats.Conn) error {
	if nc != nil && nc.IsConnected() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastErr != nil {
		return l.lastErr
	}
	return ErrNATSNotConnected
}

// Watch runs until ctx ends. While nc is not connected it dials url with
// probe (the connection's own credentials and TLS options) every few
// seconds, without retries, and logs and keeps the error the dial returns.
// A process whose connection never came up thus logs "Authorization
// Violation" or a certificate error within a second of starting.
func (l *NATSLink) Watch(ctx context.Context, nc *nats.Conn, url string, probe []nats.Option) {
	wait := 200 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.closed:
			return
		case <-t.C:
		}
		if nc.IsClosed() {
			return
		}
		if nc.IsConnected() {
			wait = 200 * time.Millisecond
			t.Reset(wait)
			continue
		}
		// A dial that succeeds says nothing new: the connection is about
		// to come back on its own.
		if err := dialOnce(url, l.name, probe); err != nil && !nc.IsConnected() {
			l.record(err)
		}
		wait = min(2*wait, 5*time.Second)
		t.Reset(wait)
	}
}

func (l *NATSLink) record(err error) {
	l.mu.Lock()
	l.lastErr = err
	changed := l.logged != err.Error()
	if changed {
		l.logged = err.Error()
	}
	l.mu.Unlock()
	if changed {
		l.log.Error("NATS connection failing", "conn", l.name, "err", err)
	}
}

// dialOnce connects once with opts (and no reconnects) and closes again.
func dialOnce(url, name string, opts []nats.Option) error {
	o := append(append([]nats.Option{}, opts...),
		nats.Name(name+"-probe"),
		nats.NoReconnect(),
		nats.RetryOnFailedConnect(false),
		nats.Timeout(3*time.Second),
		nats.NoCallbacksAfterClientClose(),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
	)
	c, err := nats.Connect(url, o...)
	if errors.Is(err, nats.ErrNoServers) {
		// nats.go says only that no server answered; the dial says why.
		if derr := dialAny(url); derr != nil {
			err = fmt.Errorf("%w: %w", err, derr)
		}
	}
	if err != nil {
		return fmt.Errorf("NATS %s: %w", redact(url), err)
	}
	c.Close()
	return nil
}

// dialAny dials the hosts of a comma-separated URL list over TCP and
// returns nil as soon as one answers, else the last dial's error.
func dialAny(urls string) error {
	var last error
	for _, p := range strings.Split(urls, ",") {
		u, err := neturl.Parse(strings.TrimSpace(p))
		if err != nil || u.Host == "" {
			continue
		}
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "4222")
		}
		c, err := net.DialTimeout("tcp", host, 2*time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		last = err
	}
	return last
}

// redact drops credentials from a comma-separated URL list before it is
// logged.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := neturl.Parse(p); err == nil && u.User != nil {
			u.User = nil
			p = u.String()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}
