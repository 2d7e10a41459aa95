package openai

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// sseServer answers every POST with tokens SSE events, each after pause,
// and counts the connections it accepted.
func sseServer(t *testing.T, tokens int, pause, idle time.Duration, gone chan<- struct{}) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
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
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Config.IdleTimeout = idle
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
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

// Streams reuse the adapter's own connections, and one the engine closed
// while it sat idle costs the next request nothing: it is sent again on a
// new connection.
func TestStreamConnsReuse(t *testing.T) {
	srv, conns := sseServer(t, 3, 0, 100*time.Millisecond, nil)
	a, err := New(srv.URL, 2)
	if err != nil {
		t.Fatal(err)
	}
	if a.conns == nil {
		t.Fatal("no own connections for a plain-http engine")
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
	time.Sleep(300 * time.Millisecond) // the engine closes the idle connection
	if text, err := streamText(context.Background(), a); err != nil || strings.Count(text, "\n") != 3 {
		t.Fatalf("after the engine closed the idle connection: %q, %v", text, err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// A cancelled stream closes its connection at once, so the engine sees
// its client go and stops.
func TestStreamConnsCancel(t *testing.T) {
	gone := make(chan struct{}, 1)
	srv, _ := sseServer(t, 1000, 10*time.Millisecond, 0, gone)
	a, err := New(srv.URL, 2)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done, first := startStream(a)
	<-first // the stream runs
	cancel()
	awaitCancelled(t, done, gone)
	if n := len(a.conns.idle); n != 0 {
		t.Fatalf("a cancelled stream's connection went back to the pool (%d idle)", n)
	}
}

// An engine that is not there is engine_down, as through net/http.
func TestStreamConnsDown(t *testing.T) {
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
	if !errorsAs(err, &we) || we.Code != wire.CodeEngineDown || !strings.Contains(we.Message, "connection refused") {
		t.Fatalf("got %v, want engine_down", err)
	}
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// A request cancelled while the adapter waits for the engine's answer
// (an engine still prefilling a long prompt) ends at once and closes the
// connection, so the engine sees its client go.
func TestStreamConnsCancelBeforeAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	requested, closed := make(chan struct{}), make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for seen := false; ; seen = true {
			// The request is read and never answered; the read ends
			// when the adapter closes the connection.
			if _, err := c.Read(buf); err != nil {
				close(closed)
				return
			}
			if !seen {
				close(requested)
			}
		}
	}()
	a, err := New("http://"+ln.Addr().String(), 2)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done, _ := startStream(a)
	<-requested // the adapter waits for the answer
	cancel()
	awaitCancelled(t, done, closed)
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
	case <-time.After(time.Second):
		t.Fatal("a cancelled stream did not end")
	}
	select {
	case <-gone:
	case <-time.After(time.Second):
		t.Fatal("the engine did not see the client go")
	}
}
