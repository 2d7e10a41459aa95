package h1

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// conn is one client connection. Two goroutines serve it: the reader
// (serve) reads and parses requests and, while a handler runs, waits on
// the connection for the client's next bytes, so that a client that goes
// away cancels its request at once; the handler goroutine (handle) runs
// each request and writes its response. net/http instead starts a
// background read per request and stops it with a deadline in the past
// before the next, some of the per-request cost this package saves.
type conn struct {
	srv *Server
	// raw is the accepted connection (closed by Shutdown and Close from
	// other goroutines); nc is what the reader and handler use, raw or
	// its TLS session.
	raw net.Conn
	nc  net.Conn
	// reqs takes a request from the reader to the handler goroutine, done
	// tells the reader that its response is out.
	reqs chan *http.Request
	done chan struct{}
	// state is connIdle while the connection waits for a request with
	// nothing of one read (Shutdown may close it), connServing while a
	// request runs, connReading once bytes of a next request came.
	state atomic.Int32
	// closeAfter is set by the handler goroutine before done: the
	// response asked for the connection's end (or failed).
	closeAfter bool
	cancel     context.CancelFunc // the running request's

	buf  []byte // what was read and not yet parsed: buf[r:]
	r    int
	peek []byte // what watch reads
	resp response
	out  []byte // the response's head, reused
	// rc is nc's socket when nc is plain TCP (see FlushNow), rw what
	// writes on it.
	rc syscall.RawConn
	rw rawWriter
	// probe checks, once, on a request that runs on, that its client
	// did not leave as it sent it (see watchRaw).
	probe *time.Timer
	// remote is the client's address, as every request's RemoteAddr;
	// tmpl is where a request is put together before WithContext copies
	// it (then emptied): neither is made anew per request.
	remote string
	tmpl   http.Request
}

// A connection's states (conn.state).
const (
	connIdle int32 = iota
	connServing
	connReading
)

// maxKeptBuffer bounds the buffers a connection keeps between requests;
// firstBuffer is the size a connection's read buffer starts at.
const (
	maxKeptBuffer = 64 << 10
	firstBuffer   = 4096
)

// keepOut keeps b's array for the next head if it is not too big.
func (c *conn) keepOut(b []byte) {
	if cap(b) <= maxKeptBuffer {
		c.out = b[:0]
	}
}

func (c *conn) serve() {
	handedOff := false
	defer func() {
		if !handedOff {
			_ = c.nc.Close()
		}
		c.srv.forget(c)
	}()
	// The first request's head is bounded as every later one's wait.
	_ = c.raw.SetReadDeadline(time.Now().Add(max(c.srv.ReadHeaderTimeout, c.srv.IdleTimeout)))
	if tc, ok := c.nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // Go's default, kept explicit: SSE events go out as written
	}
	if c.srv.TLSConfig != nil {
		tconn := tls.Server(c.nc, c.srv.TLSConfig)
		_ = tconn.SetDeadline(time.Now().Add(c.srv.ReadHeaderTimeout))
		if err := tconn.Handshake(); err != nil {
			return
		}
		_ = tconn.SetDeadline(time.Time{})
		c.nc = tconn
		if tconn.ConnectionState().NegotiatedProtocol == "h2" {
			handedOff = c.srv.handoff.give(tconn)
			return
		}
	}
	c.rc = rawOf(c.nc)
	go c.handle()
	defer close(c.reqs)
	c.buf = make([]byte, 0, firstBuffer)
	for {
		req, handoff, err := c.next(false)
		if err != nil {
			return
		}
		if !handoff {
			var goOn bool
			if c.rc != nil {
				goOn, handoff = c.watchRaw(req)
			} else {
				c.state.Store(connServing)
				c.reqs <- req
				goOn = c.watch()
			}
			if !goOn || c.closeAfter || c.srv.shutting.Load() {
				return
			}
		}
		if handoff {
			handedOff = c.srv.handoff.give(&prefixConn{Conn: c.nc, pre: bytes.Clone(c.buf[c.r:])})
			return
		}
	}
}

// watch waits while the handler runs: for the handler's end, or for the
// client's next bytes or its end. A client gone cancels its request; the
// bytes of a next request (pipelined) wait until the response is out. It
// reads into its own buffer: the request's body, in buf, is the handler's
// until it returns. It reports whether the connection may go on.
func (c *conn) watch() bool {
	if c.r < len(c.buf) {
		// The next request is here already (pipelined): its turn comes
		// when this one's response is out.
		<-c.done
		return true
	}
	if c.peek == nil {
		c.peek = make([]byte, 4096)
	}
	n, err := c.nc.Read(c.peek)
	if n > 0 {
		c.state.Store(connReading)
	}
	if err != nil && n == 0 {
		var ne net.Error
		if !(errors.As(err, &ne) && ne.Timeout()) || !c.handlerIdle() {
			// The client went away (or broke the connection) while its
			// request ran: the handler learns it from its context.
			c.cancel()
		}
		<-c.done
		return false
	}
	<-c.done
	c.compact()
	c.buf = append(c.buf, c.peek[:n]...)
	return true
}

// compact moves the unparsed bytes to buf's start and makes room to read.
// A buffer a long body grew past maxKeptBuffer is let go once what is
// left of it is small: a kept-alive connection does not hold its largest
// body's memory while it waits for the next request.
func (c *conn) compact() {
	if rest := len(c.buf) - c.r; cap(c.buf) > maxKeptBuffer && rest < firstBuffer/2 {
		nb := make([]byte, rest, firstBuffer)
		copy(nb, c.buf[c.r:])
		c.buf, c.r = nb, 0
		return
	}
	if c.r > 0 {
		n := copy(c.buf, c.buf[c.r:])
		c.buf, c.r = c.buf[:n], 0
	}
	if len(c.buf) == cap(c.buf) {
		c.buf = append(c.buf, make([]byte, cap(c.buf))...)[:len(c.buf)]
	}
}

// fill reads more into buf within the deadline d from now (0: none).
func (c *conn) fill(d time.Duration) error {
	c.compact()
	if d > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(d))
	}
	n, err := c.nc.Read(c.buf[len(c.buf):cap(c.buf)])
	c.buf = c.buf[:len(c.buf)+n]
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// next reads the next request: a request to serve here, or handoff when
// the connection goes to the fallback server from this request on (its
// bytes are still in buf[r:]). With buffered set it reads nothing: a
// request not whole in buf is errNeedRead, and buf and r are as they were.
func (c *conn) next(buffered bool) (*http.Request, bool, error) {
	s := c.srv
	// The head: wait for its first byte as long as the idle timeout
	// allows (set when the last response went out), then for the rest as
	// long as the header timeout.
	if c.r == len(c.buf) {
		if buffered {
			return nil, false, errNeedRead
		}
		if err := c.fill(0); err != nil {
			return nil, false, err
		}
	}
	c.state.Store(connReading)
	headerBy := time.Time{}
	for {
		end := bytes.Index(c.buf[c.r:], crlfcrlf)
		if end >= 0 {
			break
		}
		if len(c.buf)-c.r >= s.MaxHeaderBytes || bytes.IndexByte(c.buf[c.r:], '\n') >= 0 && !wellFormedSoFar(c.buf[c.r:]) {
			return nil, true, nil // net/http answers it
		}
		if buffered {
			return nil, false, errNeedRead
		}
		if headerBy.IsZero() {
			headerBy = time.Now().Add(s.ReadHeaderTimeout)
		}
		if err := c.fill(time.Until(headerBy)); err != nil {
			return nil, false, err
		}
	}
	h, ok := parseHead(c.buf[c.r:], s.MaxHeaderBytes)
	if !ok || !s.Fast(h.method, h.target) || h.contentLength > s.MaxBody {
		return nil, true, nil
	}
	// The body, in full, before the handler runs.
	bodyAt := c.r + h.size
	if need := bodyAt + int(h.contentLength) - len(c.buf); need > 0 {
		if buffered {
			return nil, false, errNeedRead
		}
		if h.expectContinue {
			if _, err := c.nc.Write(continue100); err != nil {
				return nil, false, err
			}
		}
		c.buf = slices.Grow(c.buf, need) // room for all of it: one read may take it
		_ = c.nc.SetReadDeadline(time.Now().Add(s.BodyReadTimeout))
		for len(c.buf) < bodyAt+int(h.contentLength) {
			n, err := c.nc.Read(c.buf[len(c.buf):cap(c.buf)])
			c.buf = c.buf[:len(c.buf)+n]
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					c.bodyTimeout()
				}
				return nil, false, err
			}
			if n == 0 {
				return nil, false, io.ErrNoProgress
			}
		}
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	body := c.buf[bodyAt : bodyAt+int(h.contentLength) : bodyAt+int(h.contentLength)]
	req, err := c.request(h, body)
	if err != nil {
		// An odd target (no URL: a bad escape): net/http answers it, from
		// its head on.
		return nil, true, nil
	}
	c.r = bodyAt + int(h.contentLength)
	return req, false, nil
}

// errNeedRead is next's answer, with buffered set, for a request that is
// not whole in the buffer.
var errNeedRead = errors.New("h1: request not whole in the buffer")

var (
	crlfcrlf    = []byte("\r\n\r\n")
	continue100 = []byte("HTTP/1.1 100 Continue\r\n\r\n")
)

// wellFormedSoFar reports whether the lines of an unfinished head end in
// CRLF: a bare LF is left to net/http.
func wellFormedSoFar(b []byte) bool {
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return true
		}
		if i == 0 || b[i-1] != '\r' {
			return false
		}
		b = b[i+1:]
	}
}

// bodyTimeout answers a body that did not come within BodyReadTimeout, as
// the broker's handler would: 408 in OpenAI's error shape, and the
// connection's end.
func (c *conn) bodyTimeout() {
	msg := `{"error":{"message":"request body not received within ` + c.srv.BodyReadTimeout.String() +
		`; the broker's --read-body-timeout sets this bound","type":"invalid_request_error","param":null,"code":"body_timeout"}}` + "\n"
	b := []byte("HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ")
	b = strconv.AppendInt(b, int64(len(msg)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, msg...)
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.nc.Write(b)
}

// request builds the *http.Request the handler gets.
func (c *conn) request(h *head, body []byte) (*http.Request, error) {
	u, err := url.ParseRequestURI(h.target)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if c.remote == "" {
		c.remote = c.nc.RemoteAddr().String()
	}
	req := &c.tmpl
	*req = http.Request{
		Method:        h.method,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h.header,
		Body:          &bodyReader{b: body},
		ContentLength: h.contentLength,
		Host:          h.host,
		RemoteAddr:    c.remote,
		RequestURI:    h.target,
		Close:         h.close,
	}
	if tc, ok := c.nc.(*tls.Conn); ok {
		st := tc.ConnectionState()
		req.TLS = &st
	}
	r := req.WithContext(ctx)
	*req = http.Request{} // keeps nothing of the request (its body) while idle
	return r, nil
}

// handle runs the requests the reader hands over, one at a time.
func (c *conn) handle() {
	for req := range c.reqs {
		c.serveOne(req)
		if c.closeAfter {
			c.closeWrite()
		}
		c.done <- struct{}{}
	}
}

// closeWrite ends a connection after its last response: the reader, which
// waits on it, then sees the client's end (or gives up on it after
// closeLinger) and closes it. Half-closing first, as net/http does, lets
// the client read the answer before any bytes it still sends would make
// the kernel reset the connection.
func (c *conn) closeWrite() {
	if cw, ok := c.nc.(closeWriter); ok && cw.CloseWrite() == nil {
		_ = c.nc.SetReadDeadline(time.Now().Add(closeLinger))
		return
	}
	_ = c.raw.Close()
}

// closeLinger is how long a half-closed connection waits for the
// client's end (net/http waits 500 ms).
const closeLinger = 500 * time.Millisecond

func (c *conn) serveOne(req *http.Request) {
	w := &c.resp
	// The last response's header map, emptied: its handler has returned.
	hdr := w.header
	if hdr == nil {
		hdr = make(http.Header, 8)
	} else {
		clear(hdr)
	}
	*w = response{c: c, header: hdr, body: w.body[:0], closeAft: req.Close}
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				c.srv.Log.Error("http: panic serving request", "remote", req.RemoteAddr, "panic", v, "stack", string(debug.Stack()))
			}
			c.closeAfter = true
			c.cancel()
			return
		}
		err := w.finish()
		c.cancel()
		if cap(w.body) > maxKeptBuffer {
			w.body = nil
		}
		c.closeAfter = err != nil || w.closeAft || req.Close || c.srv.shutting.Load()
		if !c.closeAfter {
			_ = c.nc.SetReadDeadline(time.Now().Add(c.srv.IdleTimeout))
			_ = c.nc.SetWriteDeadline(time.Time{})
			// Idle, unless the reader already has bytes of the next one.
			c.state.CompareAndSwap(connServing, connIdle)
		}
	}()
	c.srv.Handler.ServeHTTP(w, req)
}

// bodyReader is a request's body, read in full before the handler runs.
type bodyReader struct {
	b []byte
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *bodyReader) Close() error { return nil }

// handlerIdle reports whether the handler finished (its done is sent),
// without taking the signal.
func (c *conn) handlerIdle() bool { return len(c.done) > 0 }
