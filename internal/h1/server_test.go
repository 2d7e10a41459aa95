package h1

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// fast is the route served here in these tests.
func fast(method, target string) bool { return method == http.MethodPost && target == "/fast" }

// testServer serves h (for /fast) and a fallback that says so in a
// header, on a loopback port.
func testServer(t *testing.T, h http.HandlerFunc, opts ...func(*Server)) (*Server, string) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/fast", h)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Served-By", "fallback")
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, len(body))
	})
	fb := http.NewServeMux()
	fb.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Served-By", "fallback")
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, len(body))
	})
	s := &Server{
		Handler:  mux,
		Fast:     fast,
		Fallback: &http.Server{Handler: fb},
		MaxBody:  1 << 20,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, o := range opts {
		o(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

func echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Served-By", "h1")
	fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
}

// raw sends req on a new connection and returns it with a reader.
func raw(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func readResp(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// countingClient is a client that counts the connections it dials.
func countingClient(t *testing.T) (*http.Client, *atomic.Int32) {
	conns := new(atomic.Int32)
	tr := &http.Transport{DialContext: func(ctx context.Context, n, a string) (net.Conn, error) {
		conns.Add(1)
		return (&net.Dialer{}).DialContext(ctx, n, a)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, conns
}

// TestServesAndKeepsAlive: the fast route is served here, whole answers
// with their length, on one kept-alive connection.
func TestServesAndKeepsAlive(t *testing.T) {
	_, addr := testServer(t, echo)
	client, conns := countingClient(t)
	for i := range 3 {
		resp, err := client.Post("http://"+addr+"/fast", "application/json", strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf(`POST /fast {"n":%d}`, i); string(body) != want || resp.Header.Get("X-Served-By") != "h1" {
			t.Fatalf("request %d: %q by %q, want %q by h1", i, body, resp.Header.Get("X-Served-By"), want)
		}
		if resp.ContentLength != int64(len(body)) || resp.Header.Get("Date") == "" {
			t.Fatalf("request %d: length %d, Date %q", i, resp.ContentLength, resp.Header.Get("Date"))
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("3 requests on %d connections, want 1", n)
	}
}

// TestKeptAliveRequestsOwnNothing: a connection's requests share its
// buffers, not their state: a header one response set is not in the
// next, and each request has its own body, context and client address.
func TestKeptAliveRequestsOwnNothing(t *testing.T) {
	var n atomic.Int32
	var first *http.Request
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if n.Add(1) == 1 {
			w.Header().Set("X-Only-First", "1")
			first = r
		} else if first == r || first.Context() == r.Context() {
			t.Error("the second request is the first's")
		}
		if r.RemoteAddr == "" {
			t.Error("no RemoteAddr")
		}
		fmt.Fprintf(w, "%s", body)
	})
	c, br := raw(t, addr)
	for i, want := range []string{"one", "two"} {
		fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(want), want)
		resp, body := readResp(t, br)
		if body != want || (resp.Header.Get("X-Only-First") != "") != (i == 0) {
			t.Fatalf("response %d: %q with X-Only-First %q", i, body, resp.Header.Get("X-Only-First"))
		}
	}
	if first.Context().Err() == nil {
		t.Fatal("the first request's context lives on")
	}
}

// TestStreamsChunked: flushed writes go out as chunks as they are made;
// the body ends when the handler returns.
func TestStreamsChunked(t *testing.T) {
	next := make(chan struct{})
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			http.NewResponseController(w).Flush()
			<-next
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("transfer encoding %v, want chunked", resp.TransferEncoding)
	}
	line := bufio.NewReader(resp.Body)
	for i := range 3 {
		l, err := line.ReadString('\n')
		if err != nil || l != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q, %v", i, l, err)
		}
		_, _ = line.ReadString('\n')
		next <- struct{}{}
	}
	rest, err := io.ReadAll(line)
	if err != nil || string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("the end: %q, %v", rest, err)
	}
}

// TestHandsOver: a request this server does not take goes, with its
// connection, to the fallback: another route, a chunked body, HTTP/1.0,
// a body over MaxBody, a folded or malformed header (answered 400 there),
// a head too long (431). Later requests on that connection stay there.
func TestHandsOver(t *testing.T) {
	_, addr := testServer(t, echo, func(s *Server) {
		s.MaxBody = 10
		s.MaxHeaderBytes, s.Fallback.MaxHeaderBytes = 1<<10, 1<<10
	})
	for _, tc := range []struct {
		name, req string
		status    int
	}{
		{"another route", "GET /models HTTP/1.1\r\nHost: x\r\n\r\n", 200},
		{"a query", "POST /fast?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 200},
		{"chunked body", "POST /fast HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 200},
		{"HTTP/1.0", "POST /fast HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 200},
		{"body over the bound", "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n01234567890", 200},
		{"folded header", "POST /fast HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\n{}", 200},
		{"no host", "POST /fast HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"two lengths", "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400},
		{"bare LF", "POST /fast HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}", 200},
		{"head too long", "POST /fast HTTP/1.1\r\nHost: x\r\nX-Long: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := raw(t, addr)
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			resp, body := readResp(t, br)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%q), want %d", resp.StatusCode, body, tc.status)
			}
			if tc.status == 200 && resp.Header.Get("X-Served-By") != "fallback" {
				t.Fatalf("served by %q: %q", resp.Header.Get("X-Served-By"), body)
			}
			if tc.status != 200 || resp.Close {
				return
			}
			// The connection stays with the fallback.
			fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
			if resp, body := readResp(t, br); resp.Header.Get("X-Served-By") != "fallback" {
				t.Fatalf("next request served by %q: %q", resp.Header.Get("X-Served-By"), body)
			}
		})
	}
}

// TestPipelined: requests sent together are answered in order.
func TestPipelined(t *testing.T) {
	_, addr := testServer(t, echo)
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\naPOST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nbGET /other HTTP/1.1\r\nHost: x\r\n\r\n")
	for _, want := range []string{"POST /fast a", "POST /fast b", "GET /other 0"} {
		if _, body := readResp(t, br); body != want {
			t.Fatalf("got %q, want %q", body, want)
		}
	}
}

// TestExpectContinue: a client that waits for 100 Continue gets it, and
// its body is read after.
func TestExpectContinue(t *testing.T) {
	_, addr := testServer(t, echo)
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("interim answer %q, %v", line, err)
	}
	if l, _ := br.ReadString('\n'); l != "\r\n" {
		t.Fatalf("after 100: %q", l)
	}
	io.WriteString(c, "hello")
	if _, body := readResp(t, br); body != "POST /fast hello" {
		t.Fatalf("got %q", body)
	}
}

// TestClientGoneCancels: a client that goes away while its request runs
// cancels it, on its first request and on a later one of a kept-alive
// connection (which, on a plain TCP connection, the reader serves from
// inside its raw read: see watchRaw).
func TestClientGoneCancels(t *testing.T) {
	for _, before := range []int{0, 3} {
		t.Run(fmt.Sprintf("after %d requests", before), func(t *testing.T) {
			cancelled := make(chan time.Time, 1)
			started := make(chan struct{})
			_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Wait") == "" {
					echo(w, r)
					return
				}
				close(started)
				<-r.Context().Done()
				cancelled <- time.Now()
			})
			c, br := raw(t, addr)
			for range before {
				fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
				readResp(t, br)
			}
			fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nX-Wait: 1\r\nContent-Length: 2\r\n\r\n{}")
			<-started
			closed := time.Now()
			c.Close()
			select {
			case at := <-cancelled:
				if d := at.Sub(closed); d > time.Second {
					t.Fatalf("cancelled %s after the client left", d)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the request's context was not cancelled")
			}
		})
	}
}

// TestBodyTimeout: a body that does not come in time is a 408 in
// OpenAI's shape, and the connection's end.
func TestBodyTimeout(t *testing.T) {
	_, addr := testServer(t, echo, func(s *Server) { s.BodyReadTimeout = 50 * time.Millisecond })
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}")
	resp, body := readResp(t, br)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, `"code":"body_timeout"`) || !resp.Close {
		t.Fatalf("status %d, %q, close %v", resp.StatusCode, body, resp.Close)
	}
}

// TestIdleTimeout: a kept-alive connection that stays idle is closed.
func TestIdleTimeout(t *testing.T) {
	_, addr := testServer(t, echo, func(s *Server) { s.IdleTimeout = 50 * time.Millisecond })
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	readResp(t, br)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want the server to close it", err)
	}
}

// TestConnectionClose: a request that asks for the connection's end gets
// it after its answer, which says so.
func TestConnectionClose(t *testing.T) {
	_, addr := testServer(t, echo)
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
	resp, _ := readResp(t, br)
	if !resp.Close {
		t.Fatal("answer without Connection: close")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the answer: %v, want EOF", err)
	}
}

// TestPanicClosesConnection: a handler that panics loses its connection,
// not the server.
func TestPanicClosesConnection(t *testing.T) {
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the panic: %v, want EOF", err)
	}
	c2, br2 := raw(t, addr)
	fmt.Fprintf(c2, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := readResp(t, br2); resp.StatusCode != 200 {
		t.Fatalf("the server after a panic: %d", resp.StatusCode)
	}
}

// TestShutdownFinishesStreams: Shutdown closes idle connections at once,
// lets a running stream finish, and refuses new connections.
func TestShutdownFinishesStreams(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	s, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
		started <- struct{}{}
		<-release
		fmt.Fprint(w, "data: last\n\n")
	})
	idle, idleBr := raw(t, addr)
	fmt.Fprintf(idle, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	readResp(t, idleBr) // now with the fallback, idle
	idle2, idle2Br := raw(t, addr)
	_ = idle2 // connected, nothing sent
	busy, busyBr := raw(t, addr)
	fmt.Fprintf(busy, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	<-started
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	for _, br := range []*bufio.Reader{idleBr, idle2Br} {
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("idle connection at shutdown: %v, want EOF", err)
		}
	}
	testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return errors.New("still accepting")
		}
		return nil
	})
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a stream running", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	_, body := readResp(t, busyBr)
	if body != "data: first\n\ndata: last\n\n" {
		t.Fatalf("the stream at shutdown: %q", body)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestTLS: over TLS, HTTP/1.1 is served here and h2 by the fallback.
func TestTLS(t *testing.T) {
	cert := httptest.NewTLSServer(http.NotFoundHandler())
	tlsCert := cert.TLS.Certificates
	pool := cert.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	cert.Close()
	_, addr := testServer(t, echo, func(s *Server) { s.TLSConfig = &tls.Config{Certificates: tlsCert} })
	for _, h2 := range []bool{false, true} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "example.com"}, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		resp, err := (&http.Client{Transport: tr}).Post("https://"+addr+"/fast", "text/plain", strings.NewReader("hi"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		want := "h1"
		if h2 {
			want = "fallback"
		}
		if resp.Header.Get("X-Served-By") != want || (h2 && resp.ProtoMajor != 2) {
			t.Fatalf("h2 %v: %s by %q (%q), want %s", h2, resp.Proto, resp.Header.Get("X-Served-By"), body, want)
		}
	}
}

// smallSendBuffers sets a small send buffer on every accepted connection,
// so that a client that stops reading fills it quickly.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// TestFlushNow: once the head is out, AppendNow and FlushNow write a chunk
// at once from another goroutine; when the client stops reading and the
// connection cannot take more, FlushNow keeps the rest and says
// ErrWouldBlock, and the handler's Flush sends it when the client reads
// again: every byte, in order.
func TestFlushNow(t *testing.T) {
	type nower interface {
		AppendNow([]byte)
		FlushNow() error
		WritesNow() bool
	}
	blocked := make(chan int, 1)
	s := &Server{Fast: fast, Fallback: &http.Server{Handler: http.NotFoundHandler()}, MaxBody: 1 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nw := w.(nower)
		if !nw.WritesNow() {
			t.Error("a plain TCP connection cannot write now")
		}
		nw.AppendNow([]byte("x")) // before the head: kept for the handler
		if err := nw.FlushNow(); !errors.Is(err, ErrWouldBlock) {
			t.Errorf("FlushNow before the head: %v, want ErrWouldBlock", err)
		}
		fmt.Fprint(w, "head\n")
		http.NewResponseController(w).Flush()
		// The handler's goroutine waits while another writes, as the
		// broker's reply goroutine does while its reader waits in Next.
		done := make(chan int)
		go func() {
			i := 0
			for ; i < 100000; i++ {
				nw.AppendNow(fmt.Appendf(nil, "line %d\n", i))
				err := nw.FlushNow()
				if errors.Is(err, ErrWouldBlock) {
					break
				}
				if err != nil {
					t.Errorf("FlushNow %d: %v", i, err)
					break
				}
			}
			done <- i
		}()
		n := <-done
		blocked <- n
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush after FlushNow: %v", err)
		}
		fmt.Fprint(w, "tail\n")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(smallSendBuffers{ln}) }()
	defer func() { s.Close(); <-served }()

	c, br := raw(t, ln.Addr().String())
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	var n int
	select {
	case n = <-blocked: // the client reads nothing meanwhile
	case <-time.After(10 * time.Second):
		t.Fatal("FlushNow never found the connection full")
	}
	if n == 0 || n == 100000 {
		t.Fatalf("FlushNow blocked after %d lines", n)
	}
	resp, body := readResp(t, br)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var want strings.Builder
	want.WriteString("xhead\n")
	for i := range n + 1 { // the line that found it full is kept, not lost
		fmt.Fprintf(&want, "line %d\n", i)
	}
	want.WriteString("tail\n")
	if body != want.String() {
		t.Fatalf("got %d bytes, want %d (FlushNow blocked at line %d)", len(body), want.Len(), n)
	}
}

// TestFlushNowAllocs: a stream's FlushNow, once its head is out, makes no
// allocation: one write(2) per token, through a callback made once per
// connection.
func TestFlushNowAllocs(t *testing.T) {
	type nower interface {
		AppendNow([]byte)
		FlushNow() error
	}
	allocs := make(chan float64, 1)
	line := []byte("data: {\"x\":1}\n\n")
	s := &Server{Fast: fast, Fallback: &http.Server{Handler: http.NotFoundHandler()}, MaxBody: 1 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nw := w.(nower)
		fmt.Fprint(w, "head\n")
		http.NewResponseController(w).Flush()
		failed := false
		allocs <- testing.AllocsPerRun(200, func() {
			nw.AppendNow(line)
			if err := nw.FlushNow(); err != nil && !failed {
				failed = true
				t.Errorf("FlushNow: %v", err)
			}
		})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	defer func() { s.Close(); <-served }()

	c, br := raw(t, ln.Addr().String())
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	resp, body := readResp(t, br)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// AllocsPerRun runs its function once more than it counts.
	if want := "head\n" + strings.Repeat(string(line), 201); body != want {
		t.Fatalf("got %d bytes, want %d", len(body), len(want))
	}
	if a := <-allocs; a != 0 {
		t.Fatalf("FlushNow: %.1f allocations per write, want 0", a)
	}
}

// TestFlushNowHead: once the handler has set its status, FlushNow from
// another goroutine writes the head with the first chunk, while the
// handler still runs (the client reads both before it lets the handler
// go on); a FlushNow before the status keeps what it was given. The
// handler's own writes follow, chunked, and the response ends as usual.
func TestFlushNowHead(t *testing.T) {
	type nower interface {
		AppendNow([]byte)
		FlushNow() error
	}
	goOn := make(chan struct{})
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		nw := w.(nower)
		nw.AppendNow([]byte("early\n"))
		if err := nw.FlushNow(); !errors.Is(err, ErrWouldBlock) {
			t.Errorf("FlushNow before the status: %v, want ErrWouldBlock", err)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Test", "head")
		w.WriteHeader(http.StatusOK)
		done := make(chan error)
		go func() {
			nw.AppendNow([]byte("first\n"))
			done <- nw.FlushNow()
		}()
		if err := <-done; err != nil {
			t.Errorf("FlushNow with the status set: %v", err)
		}
		<-goOn
		fmt.Fprint(w, "last\n")
	})
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("X-Test") != "head" || resp.Header.Get("Content-Type") != "text/event-stream" ||
		len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("head %d %v %v", resp.StatusCode, resp.Header, resp.TransferEncoding)
	}
	first := make([]byte, len("early\nfirst\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "early\nfirst\n" {
		t.Fatalf("before the handler went on: %q, %v", first, err)
	}
	close(goOn)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "last\n" {
		t.Fatalf("the rest: %q, %v", rest, err)
	}
}

// TestFlushNowHeadPartly: a head and first chunk that the connection
// cannot take in one write (8 MiB, more than a loopback socket holds) are
// kept from where the write stopped, framed, and the handler's Flush
// sends the rest: the client reads every byte, in order.
func TestFlushNowHeadPartly(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcde\n"), 8<<20/16)
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		nw := w.(interface {
			AppendNow([]byte)
			FlushNow() error
		})
		w.WriteHeader(http.StatusOK)
		nw.AppendNow(big)
		if err := nw.FlushNow(); !errors.Is(err, ErrWouldBlock) {
			t.Errorf("FlushNow of 8 MiB: %v, want ErrWouldBlock", err)
		}
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		fmt.Fprint(w, "tail\n")
	})
	c, br := raw(t, addr)
	fmt.Fprintf(c, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, body := readResp(t, br)
	if resp.StatusCode != 200 || body != string(big)+"tail\n" {
		t.Fatalf("status %d, %d bytes of %d", resp.StatusCode, len(body), len(big)+5)
	}
}

// TestLongBodiesKeptAlive: requests whose bodies are many times the
// connection's first buffer, of sizes that vary, one after another on one
// kept-alive connection (a multi-turn chat re-sending its conversation):
// each is read whole and the connection is never broken.
func TestLongBodiesKeptAlive(t *testing.T) {
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		fmt.Fprintf(w, "%d %x", len(body), sum)
	})
	client, conns := countingClient(t)
	for i := range 40 {
		body := bytes.Repeat([]byte{byte('a' + i%26)}, 3000+(i*7919)%60000)
		resp, err := client.Post("http://"+addr+"/fast", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("request %d (%d bytes): %v", i, len(body), err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d (%d bytes): %v", i, len(body), err)
		}
		if want := fmt.Sprintf("%d %x", len(body), sha256.Sum256(body)); string(got) != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("40 requests on %d connections, want 1", n)
	}
}

// TestLongBodiesPipelined: requests with long bodies sent back to back
// without waiting for the answers, in pieces of odd sizes, so that a
// request's head lands in the middle of the connection's buffer with its
// body still to come: each is answered whole, in order.
func TestLongBodiesPipelined(t *testing.T) {
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %x", len(body), sha256.Sum256(body))
	})
	c, br := raw(t, addr)
	var all bytes.Buffer
	var want []string
	for i := range 12 {
		body := bytes.Repeat([]byte{byte('a' + i)}, 1000+(i*15401)%50000)
		fmt.Fprintf(&all, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		want = append(want, fmt.Sprintf("%d %x", len(body), sha256.Sum256(body)))
	}
	go func() {
		b := all.Bytes()
		for piece := 1; len(b) > 0; piece++ {
			n := min(len(b), 997*piece%7919+1)
			if _, err := c.Write(b[:n]); err != nil {
				return
			}
			b = b[n:]
		}
	}()
	for i, w := range want {
		if _, body := readResp(t, br); body != w {
			t.Fatalf("request %d: %q, want %q", i, body, w)
		}
	}
}

// TestBufferLetGoAfterLongBody: once a long body is served, the
// connection's read buffer goes back to its first size, keeping the
// bytes not yet parsed; a buffer still holding much unparsed stays.
func TestBufferLetGoAfterLongBody(t *testing.T) {
	c := &conn{buf: make([]byte, 1<<20), r: 1<<20 - 10}
	copy(c.buf[c.r:], "0123456789")
	c.compact()
	if cap(c.buf) != firstBuffer || string(c.buf) != "0123456789" || c.r != 0 {
		t.Fatalf("after compact: cap %d, %q, r %d", cap(c.buf), c.buf, c.r)
	}
	c = &conn{buf: make([]byte, 1<<20), r: 1 << 19}
	c.compact()
	if len(c.buf) != 1<<19 || cap(c.buf) != 1<<20 || c.r != 0 {
		t.Fatalf("half unparsed: len %d cap %d r %d", len(c.buf), cap(c.buf), c.r)
	}
}

// TestRandomFraming: connections carrying requests of random body sizes
// (none to 200 KB, past every buffer size the loop keeps), written in
// random pieces, some one at a time and some pipelined in batches, and
// now and then a request the loop hands with its connection to net/http
// (which then serves the rest of it): every answer is the right one, in
// order. A fixed seed, so a failure repeats.
func TestRandomFraming(t *testing.T) {
	_, addr := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %x", len(body), sha256.Sum256(body))
	})
	rng := rand.New(rand.NewPCG(15, 26))
	for conn := range 8 {
		c, br := raw(t, addr)
		handedOff := false
		for batch := 0; batch < 30; {
			n := 1
			if conn%2 == 1 {
				n = 1 + rng.IntN(5) // pipelined
			}
			var out []byte
			var want []string
			for range n {
				batch++
				if rng.IntN(10) == 0 {
					out = append(out, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n"...)
					want = append(want, "GET /other 0")
					handedOff = true
					continue
				}
				size := rng.IntN(4096)
				if rng.IntN(3) == 0 {
					size = rng.IntN(200 << 10)
				}
				body := bytes.Repeat([]byte{byte('a' + batch%26)}, size)
				out = fmt.Appendf(out, "POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", size, body)
				if handedOff {
					want = append(want, fmt.Sprintf("POST /fast %d", size))
				} else {
					want = append(want, fmt.Sprintf("%d %x", size, sha256.Sum256(body)))
				}
			}
			pieces := []int{}
			for left := len(out); left > 0; {
				k := min(left, 1+rng.IntN(20000))
				pieces = append(pieces, k)
				left -= k
			}
			sent := make(chan error, 1)
			go func() {
				b := out
				for _, k := range pieces {
					if _, err := c.Write(b[:k]); err != nil {
						sent <- err
						return
					}
					b = b[k:]
				}
				sent <- nil
			}()
			for i, w := range want {
				if _, body := readResp(t, br); body != w {
					t.Fatalf("connection %d, request %d of a batch of %d: %q, want %q", conn, i, n, body, w)
				}
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestBadEscapeToNetHTTP: a target parseHead passes but that is no URL (a
// bad escape) goes to net/http with its connection, which answers it as it
// always did (400), and the loop serves nothing of it.
func TestBadEscapeToNetHTTP(t *testing.T) {
	_, addr := testServer(t, echo, func(s *Server) {
		s.Fast = func(method, target string) bool { return strings.HasPrefix(target, "/fast") }
	})
	c, br := raw(t, addr)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /fast%%zz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	resp, body := readResp(t, br)
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Served-By") == "h1" {
		t.Fatalf("status %d, served by %q: %q", resp.StatusCode, resp.Header.Get("X-Served-By"), body)
	}
}
