package openai

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// sseServer answers every POST with tokens SSE events, each after pause,
// and counts the connections it accepted and closed.
func sseServer(t *testing.T, tokens int, pause, idle time.Duration, gone chan<- struct{}) (srv *httptest.Server, conns, closed *atomic.Int32) {
	t.Helper()
	conns, closed = new(atomic.Int32), new(atomic.Int32)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		for i := range tokens {
			select {
			case <-r.Context().Done():
				if gone != nil {
					gone <- struct{}{}
				}
				return
			case <-time.After(pause):
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" t%d\"}}]}\n\n", i)
			_ = rc.Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	srv.Config.IdleTimeout = idle
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, conns, closed
}

func streamText(ctx context.Context, a *Adapter) (string, error) {
	var b strings.Builder
	err := a.Stream(ctx, &agent.Request{API: wire.API_API_CHAT, Body: []byte(`{"stream":true}`)}, func(c []byte, _ bool) error {
		b.Write(c)
		b.WriteByte('\n')
		return nil
	})
	return b.String(), err
}

// Streams reuse kept-alive connections, and one the engine closed while it
// sat idle costs the next request nothing.
func TestStreamReusesConnections(t *testing.T) {
	srv, conns, closed := sseServer(t, 3, 0, 100*time.Millisecond, nil)
	a, err := New(srv.URL, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		text, err := streamText(context.Background(), a)
		if err != nil || strings.Count(text, "\n") != 3 {
			t.Fatalf("stream %d: %q, %v", i, text, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("3 streams used %d connections, want 1", n)
	}
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if closed.Load() == 0 {
			return errors.New("the engine has not closed the idle connection")
		}
		return nil
	})
	if text, err := streamText(context.Background(), a); err != nil || strings.Count(text, "\n") != 3 {
		t.Fatalf("after the engine closed the idle connection: %q, %v", text, err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// A cancelled stream ends at once and closes its connection, so the
// engine sees its client go and stops.
func TestStreamCancel(t *testing.T) {
	gone := make(chan struct{}, 1)
	srv, _, _ := sseServer(t, 1000, 10*time.Millisecond, 0, gone)
	a, err := New(srv.URL, 2)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done, first := startStream(a)
	<-first // the stream runs
	cancel()
	awaitCancelled(t, done, gone)
}

// An engine that is not there is engine_unavailable.
func TestStreamEngineDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	a, err := New("http://"+addr, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = streamText(context.Background(), a)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeEngineDown || !strings.Contains(we.Message, "connection refused") {
		t.Fatalf("got %v, want engine_unavailable", err)
	}
}

// silentEngine accepts requests and never answers them: requested gets
// each request as it arrives, cancelled each one whose client went.
func silentEngine(t *testing.T) (url string, requested, cancelled <-chan struct{}) {
	t.Helper()
	req, gone := make(chan struct{}, 16), make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		req <- struct{}{}
		<-r.Context().Done()
		gone <- struct{}{}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, req, gone
}

// A request cancelled while the adapter waits for the engine's answer (an
// engine still prefilling a long prompt) ends at once and closes the
// connection, so the engine sees its client go.
func TestStreamCancelBeforeAnswer(t *testing.T) {
	url, requested, cancelled := silentEngine(t)
	a, err := New(url, 2, WithHeaderTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	cancel, done, _ := startStream(a)
	<-requested // the adapter waits for the answer
	cancel()
	awaitCancelled(t, done, cancelled)
}

// An engine that takes a request and sends no response headers fails it
// after the header timeout, with a retryable engine_unavailable error that
// names the engine, and sees it cancelled.
func TestStreamHeaderTimeout(t *testing.T) {
	url, requested, cancelled := silentEngine(t)
	a, err := New(url, 2, WithHeaderTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = streamText(context.Background(), a)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeEngineDown || !strings.Contains(we.Message, "engine "+url+": no response headers within 50ms") {
		t.Fatalf("got %v, want engine_unavailable naming the engine and the timeout", err)
	}
	<-requested
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine did not see the request cancelled")
	}
}

// The header timeout bounds the wait for the headers, not for the first
// token: an engine that answers at once and prefills a long prompt for
// longer than the timeout is waited for.
func TestStreamHeaderTimeoutNotFirstToken(t *testing.T) {
	const timeout = 500 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_ = http.NewResponseController(w).Flush()
		time.Sleep(2 * timeout)
		fmt.Fprint(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	a, err := New(srv.URL, 1, WithHeaderTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	if text, err := streamText(context.Background(), a); err != nil || text != "{\"choices\":[]}\n" {
		t.Fatalf("got %q, %v", text, err)
	}
}

// endlessEngine answers with a 200 and then writes chunk over and over
// until the client goes; written counts the bytes it wrote, requests the
// requests it took.
func endlessEngine(t *testing.T, contentType, chunk string) (url string, written, requests *atomic.Int64) {
	t.Helper()
	written, requests = new(atomic.Int64), new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", contentType)
		for r.Context().Err() == nil {
			n, err := io.WriteString(w, chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, written, requests
}

// An engine whose SSE line, event or JSON answer has no end fails the
// request once the bound is passed, with a bad_request error (not
// retried: any engine would answer alike) that names the engine, and the
// adapter reads little more than the bound.
func TestStreamBoundsEvents(t *testing.T) {
	const max = 64 << 10
	for _, tc := range []struct {
		name, contentType, chunk, want string
	}{
		{"a line without end", "text/event-stream", "data: " + strings.Repeat("x", 4000), fmt.Sprintf("SSE line exceeds %d bytes", max)},
		{"a comment without end", "text/event-stream", ":" + strings.Repeat("x", 4000), fmt.Sprintf("SSE line exceeds %d bytes", max)},
		{"an event without end", "text/event-stream", "data: " + strings.Repeat("x", 4000) + "\n", fmt.Sprintf("SSE event exceeds %d bytes", max)},
		{"a JSON answer without end", "application/json", strings.Repeat("x", 4000), fmt.Sprintf("answer exceeds %d bytes", max)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, written, requests := endlessEngine(t, tc.contentType, tc.chunk)
			a, err := New(url, 1, WithMaxEvent(max))
			if err != nil {
				t.Fatal(err)
			}
			events := 0
			err = a.Stream(context.Background(), &agent.Request{API: wire.API_API_CHAT, Body: []byte(`{}`)}, func([]byte, bool) error {
				events++
				return nil
			})
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != wire.CodeEngineOutputTooLarge || we.Message != "engine "+url+": "+tc.want {
				t.Fatalf("got %v, want engine_output_too_large %q", err, "engine "+url+": "+tc.want)
			}
			if events != 0 || requests.Load() != 1 {
				t.Fatalf("%d events, %d requests", events, requests.Load())
			}
			// The engine's writes fail once the adapter closed the
			// connection: what it wrote is what the sockets held.
			t.Logf("the engine wrote %d bytes", written.Load())
			if n := written.Load(); n > 64<<20 {
				t.Fatalf("the engine wrote %d bytes", n)
			}
		})
	}
}

// The headers every engine request carries: one X-Request-Id for all the
// job's legs and attempts, its trace context, the API key. A trace value a
// header cannot carry is left out instead of failing the job (or
// injecting a header).
func TestStreamHeaders(t *testing.T) {
	type seen struct {
		method, path, body string
		header             http.Header
	}
	got := make(chan seen, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, string(body), r.Header.Clone()}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	a, err := New(srv.URL+"/engine/", 2, WithAPIKey("sk-test"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"héllo"}]}`
	job := &wire.Job{RequestId: "sy-1", ClientRequestId: "client-7", Trace: map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  "a=1\r\nX-Injected: yes",
	}}
	var text strings.Builder
	err = a.Stream(context.Background(), &agent.Request{API: wire.API_API_CHAT, Body: []byte(body), Job: job}, func(c []byte, _ bool) error {
		text.Write(c)
		return nil
	})
	if err != nil || !strings.Contains(text.String(), `"x"`) {
		t.Fatalf("stream: %q, %v", text.String(), err)
	}
	s := <-got
	if s.method != http.MethodPost || s.path != "/engine/v1/chat/completions" || s.body != body {
		t.Fatalf("server read %s %s %q", s.method, s.path, s.body)
	}
	want := map[string]string{
		"Content-Type":  "application/json",
		"Accept":        "text/event-stream",
		"Authorization": "Bearer sk-test",
		"X-Request-Id":  "client-7",
		"Traceparent":   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	for k, v := range want {
		if g := s.header.Get(k); g != v {
			t.Errorf("%s: %q, want %q", k, g, v)
		}
	}
	for _, k := range []string{"Tracestate", "X-Injected", "Idempotency-Key"} {
		if v, ok := s.header[k]; ok {
			t.Errorf("%s sent: %q", k, v)
		}
	}
}

// An API key no header can carry is refused when the adapter is made, not
// at every request.
func TestNewRefusesUnsendableKey(t *testing.T) {
	if _, err := New("http://127.0.0.1:1", 1, WithAPIKey("sk-1\r\nX-Injected: yes")); err == nil {
		t.Fatal("a key with CRLF was taken")
	}
	if _, err := New("http://127.0.0.1:1", 1, WithAPIKey("sk-\tok")); err != nil {
		t.Fatalf("a key with a tab (a valid header value) was refused: %v", err)
	}
}

// startStream runs a stream on a until cancel; done gets its end, and
// first is closed at its first chunk.
func startStream(a *Adapter) (cancel func(), done <-chan error, first <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	end, got := make(chan error, 1), make(chan struct{})
	var once sync.Once
	go func() {
		end <- a.Stream(ctx, &agent.Request{API: wire.API_API_CHAT, Body: []byte(`{"stream":true}`)}, func([]byte, bool) error {
			once.Do(func() { close(got) })
			return nil
		})
	}()
	return cancel, end, got
}

// awaitCancelled waits for a cancelled stream's end (done, an error) and
// for its engine to see the client go (gone).
func awaitCancelled[T any](t *testing.T, done <-chan error, gone <-chan T) {
	t.Helper()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled stream ended well")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled stream did not end")
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine did not see the client go")
	}
}
