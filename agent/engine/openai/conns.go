package openai

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/oaiformat"
)

// streamConns is the adapter's own pool of HTTP/1.1 connections for the
// streaming posts to a plain-http engine, the agent's per-request path.
// net/http's Transport runs a writer and a reader goroutine per connection
// and hands each request and response between them and the caller: three
// goroutine hand-offs per engine request that showed as ~20% of the
// agent's CPU on short requests. Here the job's goroutine writes the
// request and reads the answer on the connection itself. The request is
// written by hand (writeRequest) and the answer's head read by hand
// (readResponse), where http.NewRequest, Request.Write and
// http.ReadResponse were another ~17% of an agent on short requests;
// chunked bodies are decoded by net/http's own reader. Everything else
// the adapter asks an engine (health, models, load, embeddings) and every
// https engine still go through net/http.
type streamConns struct {
	addr   string // what to dial
	host   string // the Host header: the base URL's host, as net/http sends it
	prefix string // the base URL's path, before every request's
	auth   string // the Authorization header's value, if any (checked by New)
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	max    int

	mu   sync.Mutex
	idle []*engineConn
}

// engineConn is one kept-alive connection to the engine.
type engineConn struct {
	c    net.Conn
	br   *bufio.Reader // the answer's head (and bodies not read as SSE)
	bw   *bufio.Writer
	used time.Time // when it went idle
	// rc and buf read SSE bodies (see stream.readSSE); rc is nil when c
	// is not a TCP connection.
	rc  syscall.RawConn
	buf []byte
	// abort breaks off the request in flight: its reads and writes fail
	// at once. Made with the connection, not per request, as flushFirst.
	abort func()
	// flushFirst is flushAwait's raw read callback: the first call flushes
	// (sent, flushErr), the next ends the wait.
	flushFirst func(uintptr) bool
	sent       bool
	flushErr   error
	// events is the buffer the last answer's SSE events were gathered in.
	events []byte
	// pump reads SSE bodies on rc (see pumpRaw).
	pump rawPump
}

// idleMax is how long an idle connection is kept. Engines close idle
// connections themselves (uvicorn, under vLLM and SGLang, after 5s): one
// kept beyond that would fail its next request.
const idleMax = 3 * time.Second

// drainWait bounds reading the end of a body after [DONE] (the chunked
// terminator the engine writes right after it) before the connection is
// reused; an engine slower than this costs the connection, not the job.
const drainWait = 50 * time.Millisecond

func newStreamConns(base string, max int) *streamConns {
	u, err := url.Parse(base)
	// A base URL with credentials or a query is left to net/http.
	if err != nil || u.Scheme != "http" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
		!validPath(u.EscapedPath()) {
		return nil
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &streamConns{addr: addr, host: u.Host, prefix: strings.TrimRight(u.EscapedPath(), "/"), dial: d.DialContext, max: max + 4}
}

// get returns an idle connection (reused true) or a new one.
func (p *streamConns) get(ctx context.Context) (*engineConn, bool, error) {
	now := time.Now()
	p.mu.Lock()
	for n := len(p.idle); n > 0; n = len(p.idle) {
		ec := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		if now.Sub(ec.used) < idleMax {
			p.mu.Unlock()
			return ec, true, nil
		}
		_ = ec.c.Close()
	}
	p.mu.Unlock()
	ec, err := p.fresh(ctx)
	return ec, false, err
}

func (p *streamConns) fresh(ctx context.Context) (*engineConn, error) {
	c, err := p.dial(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	ec := &engineConn{c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 8<<10)}
	ec.abort = func() { _ = ec.c.SetDeadline(longAgo) }
	ec.flushFirst = func(uintptr) bool {
		if ec.sent {
			return true
		}
		ec.sent = true
		ec.flushErr = ec.bw.Flush()
		return ec.flushErr != nil
	}
	ec.rc = rawConn(c)
	return ec, nil
}

// put keeps ec for the next request, or closes it when the pool is full.
func (p *streamConns) put(ec *engineConn) {
	ec.used = time.Now()
	p.mu.Lock()
	if len(p.idle) < p.max {
		p.idle = append(p.idle, ec)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	_ = ec.c.Close()
}

// longAgo is a deadline in the past: it wakes every blocked read and
// write on a connection at once.
var longAgo = time.Unix(1, 0)

// stream is an engine answer read on a pooled connection: Body reads the
// connection in the caller's goroutine, and Close gives the connection
// back if the answer was read to its end, or closes it.
type stream struct {
	*http.Response
	p     *streamConns
	ec    *engineConn
	stop  func() bool // ends the context watch
	bad   bool
	close sync.Once
	// feed is the body's decoder once readSSE reads it (raw): the body is
	// then read from the connection, not through Body.
	feed sseFeed
	raw  bool
}

// engineRequest is one streaming post on the adapter's own connections:
// a JSON body that asks for SSE.
type engineRequest struct {
	path      string // the endpoint's, after the base URL's
	body      []byte
	requestID string            // X-Request-Id, if any
	trace     map[string]string // the job's trace context (oaiformat.TraceHeaders)
}

// do writes r on a pooled connection and reads the answer's head. A
// reused connection that the engine closed while it sat idle fails before
// any byte of an answer: the request is then sent once more on a new
// connection (the engine never saw it).
func (p *streamConns) do(ctx context.Context, r *engineRequest) (*stream, error) {
	for try := 0; ; try++ {
		ec, reused, err := p.get(ctx)
		if err != nil {
			return nil, err
		}
		// A cancelled request breaks off at once: its reads and writes
		// fail, and the connection is closed, which tells the engine.
		stop := afterFunc(ctx, ec.abort)
		resp, err := p.roundTrip(ec, r)
		if err == nil {
			return &stream{Response: resp, p: p, ec: ec, stop: stop}, nil
		}
		stop()
		_ = ec.c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !reused || try > 0 || !errors.Is(err, errNoAnswer) {
			return nil, err
		}
	}
}

// afterFunc is context.AfterFunc, through ctx's own AfterFunc method when
// it has one (an agent's job context): no context of its own is made. f
// may then run in the goroutine that cancels ctx, so it must not block.
func afterFunc(ctx context.Context, f func()) (stop func() bool) {
	if a, ok := ctx.(interface{ AfterFunc(func()) func() bool }); ok {
		return a.AfterFunc(f)
	}
	return context.AfterFunc(ctx, f)
}

// errNoAnswer is a connection that ended before the first byte of an
// answer.
var errNoAnswer = errors.New("engine closed the connection before answering")

func (p *streamConns) roundTrip(ec *engineConn, r *engineRequest) (*http.Response, error) {
	if err := p.writeRequest(ec.bw, r); err != nil {
		return nil, err
	}
	if err := ec.flushAwait(); err != nil {
		return nil, errNoAnswer // written into a closed connection
	}
	if _, err := ec.br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
			return nil, errNoAnswer
		}
		return nil, err
	}
	return readResponse(ec.br)
}

// flushAwait sends the request written into bw and, on a TCP connection,
// waits until the answer's first bytes can be read. Reading at once, as
// Go's Read does, costs a read(2) per request that finds nothing (EAGAIN):
// the engine has not answered a request sent a moment ago. The wait starts
// before the request goes out, inside the socket's raw read: starting it
// resets the runtime poller's readiness, which would lose an answer that
// came between the write and the wait. Bytes left unread from before
// cannot be there: a connection is reused only when its last answer was
// read to its end. An engine that closed the connection while it was
// idle answers the request with a reset, which wakes the wait too.
func (ec *engineConn) flushAwait() error {
	if ec.rc == nil || ec.br.Buffered() > 0 {
		return ec.bw.Flush()
	}
	ec.sent, ec.flushErr = false, nil
	err := ec.rc.Read(ec.flushFirst)
	if ec.flushErr != nil {
		return ec.flushErr
	}
	if err != nil && !ec.sent {
		// The wait could not start (a deadline passed, the connection
		// closed): the request goes out, or fails, as it would have.
		return ec.bw.Flush()
	}
	return nil // a wait that ended in an error: the read after it reports it
}

// writeRequest writes r's request line, header and body into bw: the
// header net/http would send for the same request. A request id or trace
// value the header cannot carry (a control character) is left out rather
// than failing the job; net/http refused the whole request.
func (p *streamConns) writeRequest(bw *bufio.Writer, r *engineRequest) error {
	path := r.path
	if p.prefix != "" {
		path = p.prefix + r.path
	}
	if !validPath(path) {
		return fmt.Errorf("invalid request path %q", path)
	}
	bw.WriteString("POST ")
	bw.WriteString(path)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(p.host)
	bw.WriteString("\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(r.body)), 10))
	bw.WriteString("\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n")
	writeField(bw, "Authorization", p.auth)
	writeField(bw, "X-Request-Id", r.requestID)
	for i, k := range oaiformat.TraceHeaders {
		writeField(bw, traceHeaderNames[i], r.trace[k])
	}
	bw.WriteString("\r\n")
	_, err := bw.Write(r.body)
	return err
}

// writeField writes one header field, unless its value is empty or one a
// header cannot carry.
func writeField(bw *bufio.Writer, name, value string) {
	if value == "" || !validHeaderValue(value) {
		return
	}
	bw.WriteString(name)
	bw.WriteString(": ")
	bw.WriteString(value)
	bw.WriteString("\r\n")
}

// traceHeaderNames are oaiformat.TraceHeaders as header names.
var traceHeaderNames = func() []string {
	names := make([]string, len(oaiformat.TraceHeaders))
	for i, k := range oaiformat.TraceHeaders {
		names[i] = textproto.CanonicalMIMEHeaderKey(k)
	}
	return names
}()

// validHeaderValue reports whether v can be a header field's value: no
// control character but the tab (what net/http accepts).
func validHeaderValue[T string | []byte](v T) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

// validPath reports whether path can stand in a request line: empty (the
// base URL's) or from "/", with no space or control character.
func validPath(path string) bool {
	if path != "" && path[0] != '/' {
		return false
	}
	for i := 0; i < len(path); i++ {
		if b := path[i]; b <= ' ' || b == 0x7f {
			return false
		}
	}
	return true
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// Close ends the answer: the connection goes back to the pool if its body
// was read to the end (what is left after [DONE] is read for a moment),
// else it is closed.
func (s *stream) Close() error {
	s.close.Do(func() {
		watching := s.stop()
		reuse := watching && !s.bad && !s.Response.Close
		if reuse && s.raw {
			if !s.feed.bodyDone && s.feed.sseDone {
				// [DONE] came, the chunked body's end not yet.
				_ = s.ec.c.SetReadDeadline(time.Now().Add(drainWait))
				reuse = s.pump(nil) == nil && s.feed.bodyDone
				_ = s.ec.c.SetReadDeadline(time.Time{})
			}
			reuse = reuse && s.feed.bodyDone && !s.feed.pastBody
		} else if reuse {
			_ = s.ec.c.SetReadDeadline(time.Now().Add(drainWait))
			_, err := io.Copy(io.Discard, s.Body)
			reuse = err == nil && s.Body.Close() == nil && s.ec.br.Buffered() == 0
			_ = s.ec.c.SetReadDeadline(time.Time{})
		}
		if reuse {
			if s.raw {
				// Nobody holds an event past its emit: the next answer
				// on the connection gathers its events here too.
				s.ec.events = s.feed.data[:0]
			}
			s.p.put(s.ec)
			return
		}
		_ = s.ec.c.Close()
	})
	return nil
}

// readSSE relays the answer's events to emit, as ReadSSE does, reading the
// connection itself the way an event loop does.
//
// Go's net.Conn.Read asks the kernel first and waits for the poller only
// when told EAGAIN, so a reader of one small event at a time makes two
// read(2) calls per event: the one that returns it and, on its next Read,
// one that finds the socket empty (11,695 of 23,766 reads in an strace of
// an agent at 32 streams). nginx makes one: a read that returned less than
// it asked for emptied the socket, so it waits for readiness next. Here
// one RawConn.Read serves the whole answer and its function does the
// same: after a short read it returns false, and the poller parks the
// goroutine until the next arrival. It has to be one call: every Read,
// RawConn's too, begins by clearing the poller's memory of an arrival, so
// a wait begun in a later call could miss data that came in between. Within
// the call nothing clears it: data that arrives while the events of the
// last read are handled marks the connection readable, and the wait
// returns at once. Deadlines and Close end the wait as they end a Read.
func (s *stream) readSSE(emit agent.Emit) error {
	fr := framedByClose
	switch {
	case len(s.TransferEncoding) > 0:
		fr = framedByChunks
	case s.ContentLength >= 0:
		fr = framedByLength
	}
	s.feed, s.raw = newFeed(fr, s.ContentLength), true
	s.feed.data = s.ec.events[:0] // the last answer's, on this connection
	// What the head's reader took past the head goes first.
	if n := s.ec.br.Buffered(); n > 0 {
		b, _ := s.ec.br.Peek(n)
		done, err := s.feed.push(b, emit)
		_, _ = s.ec.br.Discard(n)
		if done {
			return err
		}
	}
	return s.pump(emit)
}

// pump reads the connection into the feed until the stream ends (or, with
// emit nil, until the body ends), returning how it ended.
func (s *stream) pump(emit agent.Emit) error {
	if s.ec.buf == nil {
		s.ec.buf = make([]byte, 16<<10)
	}
	if s.ec.rc == nil {
		return s.pumpConn(emit)
	}
	return s.pumpRaw(emit)
}

// pumpConn is pump for a connection that is not a socket: it reads
// through net.Conn.
func (s *stream) pumpConn(emit agent.Emit) error {
	f, ec := &s.feed, s.ec
	for {
		n, err := ec.c.Read(ec.buf)
		if n > 0 {
			if done, ferr := f.push(ec.buf[:n], emit); done || emit == nil && f.bodyDone {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return f.eof(emit)
		}
		if err != nil {
			return f.broken(emit, err)
		}
	}
}
