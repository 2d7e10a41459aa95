package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// hostileEngine is a sim-engine whose completions are answered by post
// instead: its health, models and metrics are a sim-engine's, so an agent
// takes it for a good engine. It counts the posts in served.
func hostileEngine(t *testing.T, post http.HandlerFunc) *engine {
	t.Helper()
	se, err := simengine.New(simengineConfig(model))
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{Engine: se}
	h := se.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path == "/tokenize" {
			h.ServeHTTP(w, r)
			return
		}
		e.served.Add(1)
		post(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	e.Stop = func() { _ = srv.Close(); _ = se.Close() }
	t.Cleanup(e.Stop)
	e.URL = "http://" + ln.Addr().String()
	cmdtest.WaitHealthy(t, e.URL)
	return e
}

// endlessEvent answers a completion with tokens chat chunks, then an SSE
// line that never ends: up to 200 MB of it, until the client goes.
func endlessEvent(tokens []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i, tok := range tokens {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", model, tok)
			if i == len(tokens)-1 {
				_ = http.NewResponseController(w).Flush()
			}
		}
		_, _ = io.WriteString(w, "data: ")
		block := []byte(strings.Repeat("x", 64<<10))
		for n := 0; n < 200<<20 && r.Context().Err() == nil; n += len(block) {
			if _, err := w.Write(block); err != nil {
				return
			}
		}
	}
}

// TestHostileEngineEventTooLarge: an engine that sends an SSE line without
// end, before its first token or after some, fails its request once: the
// agent stops reading at its bound, the broker does not run the request
// again (on either agent), and the client gets one error naming the
// engine and the bound.
func TestHostileEngineEventTooLarge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []string
	}{
		{"before the first token", nil},
		{"after two tokens", []string{"hi", " there"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := cmdtest.StartBroker(t)
			e1 := hostileEngine(t, endlessEvent(tc.tokens))
			e2 := hostileEngine(t, endlessEvent(tc.tokens))
			startAgent(t, b.NATS, "a1", e1, 2)
			startAgent(t, b.NATS, "a2", e2, 2)
			cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")
			r, err := rawStream(context.Background(), b.HTTP, "say too much", 10)
			if err != nil {
				t.Fatal(err)
			}
			if n := e1.served.Load() + e2.served.Load(); n != 1 {
				t.Fatalf("the engines saw %d requests, want 1", n)
			}
			engineURL := e1.URL
			if e2.served.Load() == 1 {
				engineURL = e2.URL
			}
			want := "engine " + engineURL + ": SSE line exceeds 262144 bytes"
			if !strings.Contains(r.errMsg, want) || r.done || r.text != strings.Join(tc.tokens, "") {
				t.Fatalf("client got %+v, want text %q and one error %q", r, strings.Join(tc.tokens, ""), want)
			}
			// An engine's fault, not the client's: never a 4xx.
			if tc.tokens == nil && r.status != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", r.status)
			}
			if strings.Count(r.errMsg, "SSE line exceeds") != 1 {
				t.Fatalf("client got %q, want the error once", r.errMsg)
			}
		})
	}
}

// TestHostileEngineNoHeaders: an engine that takes a request and never
// answers holds it only until the agent's --engine-header-timeout, not the
// broker's request timeout: the agent fails the attempt with a retryable
// error, the broker runs it on the other agent, the client gets its whole
// answer, and the hung engine sees the request cancelled.
func TestHostileEngineNoHeaders(t *testing.T) {
	b := cmdtest.StartBroker(t, "--retry-limit", "20")
	var cancelled atomic.Int32
	hung := hostileEngine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
		cancelled.Add(1)
	})
	startAgent(t, b.NATS, "hung", hung, 1, "--engine-header-timeout", "500ms")
	cmdtest.WaitEligible(t, b.HTTP, "hung")
	const prompt = "are you there"
	res := make(chan streamResult, 1)
	go func() {
		r, err := rawStream(context.Background(), b.HTTP, prompt, 8)
		if err != nil {
			r.errMsg = err.Error()
		}
		res <- r
	}()
	// The request reaches the hung engine before any other agent is
	// there to take it: its retry can only go to the one that starts
	// now (or, while that one starts, to the hung one again).
	testwait.For(t, 20*time.Second, 5*time.Millisecond, func() error {
		if hung.served.Load() == 0 {
			return fmt.Errorf("the request has not reached the hung engine")
		}
		return nil
	})
	good := startEngine(t, simengineConfig(model))
	startAgent(t, b.NATS, "good", good, 2)
	r := <-res
	want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":8}`, prompt))
	if !r.done || r.text != want.Text || r.agent != "good" || r.errMsg != "" {
		t.Fatalf("client got %+v, want %q from the good agent", r, want.Text)
	}
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if c, s := cancelled.Load(), hung.served.Load(); c != s {
			return fmt.Errorf("the hung engine saw %d of its %d requests cancelled", c, s)
		}
		return nil
	})
}
