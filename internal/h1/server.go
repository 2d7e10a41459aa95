package h1

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves HTTP/1.1 for the requests Fast picks and hands every other
// connection to Fallback, a net/http server with the same handler.
type Server struct {
	// Handler serves the requests Fast accepts, with the *http.Request
	// and http.ResponseWriter it would get from net/http (the writer
	// supports Flush and http.ResponseController's SetWriteDeadline).
	Handler http.Handler
	// Fast reports whether a request with this method and path (the
	// request target as sent, query included) is served here.
	Fast func(method, target string) bool
	// Fallback serves the connections handed over, from the request that
	// made them go on; it needs no listener of its own. Its TLSConfig is
	// not used: connections reach it decrypted, or as *tls.Conn for h2.
	Fallback *http.Server
	// MaxBody is the largest Content-Length served here; a larger body
	// goes to Fallback, whose handler refuses it (413).
	MaxBody int64
	// MaxHeaderBytes bounds a request's head (default 64 KiB); a longer
	// one goes to Fallback (431).
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading a head once its first byte came,
	// BodyReadTimeout its body, IdleTimeout the wait for the next request
	// on a kept-alive connection (defaults: 10 s, 60 s, 2 min).
	ReadHeaderTimeout, BodyReadTimeout, IdleTimeout time.Duration
	// TLSConfig, when set, makes the server speak TLS; connections that
	// negotiate h2 go to Fallback.
	TLSConfig *tls.Config
	Log       *slog.Logger

	mu       sync.Mutex
	ln       net.Listener
	conns    map[*conn]struct{}
	handoff  *handoffListener
	fbDone   chan error
	shutting atomic.Bool
}

// ErrServerClosed is what Serve returns after Shutdown or Close.
var ErrServerClosed = http.ErrServerClosed

func (s *Server) defaults() {
	if s.MaxHeaderBytes <= 0 {
		s.MaxHeaderBytes = 64 << 10
	}
	if s.ReadHeaderTimeout <= 0 {
		s.ReadHeaderTimeout = 10 * time.Second
	}
	if s.BodyReadTimeout <= 0 {
		s.BodyReadTimeout = 60 * time.Second
	}
	if s.IdleTimeout <= 0 {
		s.IdleTimeout = 2 * time.Minute
	}
	if s.Log == nil {
		s.Log = slog.Default()
	}
}

// Serve accepts connections on ln until Shutdown or Close, and returns
// ErrServerClosed then.
func (s *Server) Serve(ln net.Listener) error {
	s.defaults()
	if s.TLSConfig != nil {
		cfg := s.TLSConfig.Clone()
		if !slices.Contains(cfg.NextProtos, "http/1.1") {
			cfg.NextProtos = append(cfg.NextProtos, "http/1.1")
		}
		if !slices.Contains(cfg.NextProtos, "h2") {
			cfg.NextProtos = append([]string{"h2"}, cfg.NextProtos...)
		}
		s.TLSConfig = cfg
		// The fallback serves the h2 connections: as ServeTLS would, it
		// speaks h2 when its config offers it.
		s.Fallback.TLSConfig = cfg
	}
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.ln = ln
	s.conns = make(map[*conn]struct{})
	s.handoff = newHandoffListener(ln.Addr())
	s.fbDone = make(chan error, 1)
	s.mu.Unlock()
	go func() { s.fbDone <- s.Fallback.Serve(s.handoff) }()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.shutting.Load() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of descriptors and the like: back off, as net/http.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.Log.Warn("http: accept failed, retrying", "err", err, "in", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		c := s.newConn(nc)
		if c == nil {
			_ = nc.Close()
			return ErrServerClosed
		}
		go c.serve()
	}
}

func (s *Server) newConn(nc net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		return nil
	}
	c := &conn{srv: s, raw: nc, nc: nc, reqs: make(chan *http.Request), done: make(chan struct{}, 1)}
	s.conns[c] = struct{}{}
	return c
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Shutdown stops accepting, closes idle connections and waits for the
// others to finish their responses (Fallback's Shutdown does the same for
// the connections handed over); when ctx ends first it returns ctx's
// error and leaves the rest to Close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutting.Store(true)
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	fb := make(chan error, 1)
	go func() { fb <- s.Fallback.Shutdown(ctx) }()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.closeIdle() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return s.stopFallback(func() error { return <-fb })
}

// Close closes the listener and every connection at once.
func (s *Server) Close() error {
	s.shutting.Store(true)
	s.mu.Lock()
	ln := s.ln
	for c := range s.conns {
		_ = c.raw.Close()
	}
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	return s.stopFallback(s.Fallback.Close)
}

func (s *Server) stopFallback(stop func() error) error {
	s.mu.Lock()
	h := s.handoff
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	h.close()
	err := stop()
	<-s.fbDone
	s.fbDone <- ErrServerClosed // for a second call
	return err
}

// closeIdle closes the connections that wait for a request and reports
// how many connections are left.
func (s *Server) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.state.Load() == connIdle {
			_ = c.raw.Close()
		}
	}
	return len(s.conns)
}

// handoffListener is the listener Fallback serves: the connections this
// server hands over.
type handoffListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// give hands c over; false when the fallback no longer accepts.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *handoffListener) close() { l.once.Do(func() { close(l.closed) }) }

// Close ends the hand-overs: Fallback's Shutdown and Close call it, and
// wait for its Serve to return. A connection that would go over after it
// is closed instead.
func (l *handoffListener) Close() error { l.close(); return nil }

func (l *handoffListener) Addr() net.Addr { return l.addr }

// prefixConn is a connection whose first bytes were already read: Read
// returns them before the connection's own.
type prefixConn struct {
	net.Conn
	pre []byte
}

// CloseWrite is the connection's, when it has one: net/http ends a
// connection it refuses with it, so the client reads the answer before
// the reset its unread bytes would cause.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return nil
}

type closeWriter interface{ CloseWrite() error }

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
