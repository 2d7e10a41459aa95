package openai

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// streamConns is the adapter's own pool of HTTP/1.1 connections for the
// streaming posts to a plain-http engine, the agent's per-request path.
// net/http's Transport runs a writer and a reader goroutine per connection
// and hands each request and response between them and the caller: three
// goroutine hand-offs per engine request that showed as ~20% of the
// agent's CPU on short requests. Here the job's goroutine writes the
// request and reads the answer on the connection itself (http.ReadResponse
// parses it, chunked bodies included). Everything else the adapter asks an
// engine (health, models, load, embeddings) and every https engine still
// go through net/http.
type streamConns struct {
	addr string
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	max  int

	mu   sync.Mutex
	idle []*engineConn
}

// engineConn is one kept-alive connection to the engine.
type engineConn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time // when it went idle
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
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &streamConns{addr: addr, dial: d.DialContext, max: max + 4}
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
	return &engineConn{c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 8<<10)}, nil
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
}

// do writes req on a pooled connection and reads the answer's head. A
// reused connection that the engine closed while it sat idle fails before
// any byte of an answer: the request is then sent once more on a new
// connection (the engine never saw it).
func (p *streamConns) do(req *http.Request) (*stream, error) {
	ctx := req.Context()
	for try := 0; ; try++ {
		ec, reused, err := p.get(ctx)
		if err != nil {
			return nil, err
		}
		// A cancelled request breaks off at once: its reads and writes
		// fail, and the connection is closed, which tells the engine.
		stop := context.AfterFunc(ctx, func() { _ = ec.c.SetDeadline(longAgo) })
		resp, err := p.roundTrip(ec, req)
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
		if req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
	}
}

// errNoAnswer is a connection that ended before the first byte of an
// answer.
var errNoAnswer = errors.New("engine closed the connection before answering")

func (p *streamConns) roundTrip(ec *engineConn, req *http.Request) (*http.Response, error) {
	if err := req.Write(ec.bw); err != nil {
		return nil, err
	}
	if err := ec.bw.Flush(); err != nil {
		return nil, errNoAnswer // written into a closed connection
	}
	if _, err := ec.br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
			return nil, errNoAnswer
		}
		return nil, err
	}
	return http.ReadResponse(ec.br, req)
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
		if reuse {
			_ = s.ec.c.SetReadDeadline(time.Now().Add(drainWait))
			_, err := io.Copy(io.Discard, s.Body)
			reuse = err == nil && s.Body.Close() == nil && s.ec.br.Buffered() == 0
			_ = s.ec.c.SetReadDeadline(time.Time{})
		}
		if reuse {
			s.p.put(s.ec)
			return
		}
		_ = s.ec.c.Close()
	})
	return nil
}
