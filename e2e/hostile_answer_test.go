package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// heapPeak samples the test process's heap in use (broker, agents and
// engines all run in it) until the returned function is called, which
// returns the peak above what it was at the start. Meanwhile the
// collector runs at a quarter of its usual slack, so the peak is mostly
// what was held, not garbage waiting for a collection.
func heapPeak(t *testing.T) func() uint64 {
	t.Helper()
	gcPercent := debug.SetGCPercent(25)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	return func() uint64 {
		once.Do(func() { close(stop); <-done; debug.SetGCPercent(gcPercent) })
		if peak < base {
			return 0
		}
		return peak - base
	}
}

const mib = 1 << 20

// chatEvent is one SSE event of a chat chunk with content text.
func chatEvent(text string) []byte {
	return fmt.Appendf(nil, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", model, text)
}

// engineEnds counts the hostile engine requests that ended with their
// client gone (cancelled) and those that ended otherwise.
type engineEnds struct{ cancelled, finished atomic.Int32 }

// endless answers a completion with SSE events of size bytes of content
// each, as fast as they are read, until the request goes (counted in
// ends) or after n events and [DONE] (n < 0: never).
func endless(size, n int, ends *engineEnds) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		ev := chatEvent(strings.Repeat("x", size))
		for i := 0; n < 0 || i < n; i++ {
			if _, err := w.Write(ev); err != nil || r.Context().Err() != nil {
				ends.cancelled.Add(1)
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		ends.finished.Add(1)
	}
}

// postChat posts a chat request and returns the status and body.
func postChat(t *testing.T, base string, stream bool) (int, []byte) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"say a lot"}],"stream":%v}`, model, stream)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

// errorCode is the code of an OpenAI error body (or SSE error event).
func errorCode(data []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	return e.Error.Code
}

// waitCancelled waits until the engine saw want requests end with their
// client gone: the agent cancelled them.
func waitCancelled(t *testing.T, ends *engineEnds, want int32) {
	t.Helper()
	testwait.For(t, 60*time.Second, 10*time.Millisecond, func() error {
		if n := ends.cancelled.Load(); n < want {
			return fmt.Errorf("%d engine requests cancelled, want %d (%d finished)", n, want, ends.finished.Load())
		}
		return nil
	})
}

// TestHostileEngineAnswerTooLarge: an engine that answers without end,
// in events each well under the event bound, is cut off at the answer's
// bound in bytes (the broker's or the agent's, whichever is lower), for a
// client reading a stream, one waiting for a whole answer and a gRPC
// client: each gets one engine_output_too_large error (HTTP 502 when
// nothing was sent yet, gRPC RESOURCE_EXHAUSTED), the engine request is
// cancelled, it is not run again, and the memory held stays near the
// bound.
func TestHostileEngineAnswerTooLarge(t *testing.T) {
	const bound = 4 * mib
	for _, tc := range []struct {
		name        string
		brokerBound bool // the broker's bound is the lower one, else the agent's
		client      string
	}{
		{"broker bound, stream", true, "stream"},
		{"broker bound, whole answer", true, "whole"},
		{"broker bound, grpc", true, "grpc"},
		{"agent bound, stream", false, "stream"},
		{"agent bound, whole answer", false, "whole"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A reading client is slower than an engine that only writes:
			// a buffer above the bound keeps it from being ended as a
			// slow reader first (TestHostileEngineClientNeverReads).
			brokerArgs := []string{"--answer-buffer-bytes", fmt.Sprint(4 * bound)}
			var agentArgs []string
			if tc.brokerBound {
				brokerArgs = append(brokerArgs, "--max-answer-bytes", fmt.Sprint(bound))
			} else {
				agentArgs = []string{"--max-answer-bytes", fmt.Sprint(bound)}
			}
			b := cmdtest.StartBroker(t, brokerArgs...)
			var ends engineEnds
			e1 := hostileEngine(t, endless(200<<10, -1, &ends))
			e2 := hostileEngine(t, endless(200<<10, -1, &ends))
			startAgent(t, b.NATS, "a1", e1, 2, agentArgs...)
			startAgent(t, b.NATS, "a2", e2, 2, agentArgs...)
			cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")
			peak := heapPeak(t)
			switch tc.client {
			case "stream":
				r, err := rawStream(context.Background(), b.HTTP, "say a lot", 100000)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(r.errMsg, "answer passed") || r.done || len(r.text) > bound {
					t.Fatalf("client got status %d, %d bytes of text, done %v, error %.300q; want text up to the bound, then engine_output_too_large", r.status, len(r.text), r.done, r.errMsg)
				}
			case "whole":
				st, data := postChat(t, b.HTTP, false)
				if st != http.StatusBadGateway || errorCode(data) != "engine_output_too_large" {
					t.Fatalf("client got %d %.300s, want 502 engine_output_too_large", st, data)
				}
			case "grpc":
				s, err := grpcClient(t, b.GRPC).Chat(context.Background(), &switchyardv1.ChatRequest{
					Model: model, Messages: []*switchyardv1.Message{{Role: "user", Content: "say a lot"}},
				})
				if err != nil {
					t.Fatal(err)
				}
				var got int
				for {
					m, err := s.Recv()
					if err != nil {
						if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "answer") {
							t.Fatalf("after %d bytes: %v, want RESOURCE_EXHAUSTED for the answer's size", got, err)
						}
						break
					}
					got += len(m.GetDelta().GetDeltaText())
				}
			}
			waitCancelled(t, &ends, 1)
			grown := peak()
			if n := e1.served.Load() + e2.served.Load(); n != 1 {
				t.Fatalf("the engines saw %d requests, want 1: an answer too large is not run again", n)
			}
			// The answer's bound, what a reader holds of it at once (an
			// assembled answer is held as text, its events and its
			// encoding), and what the engine's side has in flight.
			if limit := uint64(10*bound + 64*mib); grown > limit {
				t.Fatalf("heap grew by %d MiB while the engine answered, want at most %d MiB", grown/mib, limit/mib)
			}
			t.Logf("heap grew by %d MiB", grown/mib)
		})
	}
}

// TestHostileEngineClientNeverReads: a client that sends a request and
// never reads its answer, over HTTP or gRPC, against an engine that
// answers without end, costs the broker its per-request buffer
// (--answer-buffer-bytes) and no more: the request is ended as a slow
// reader and its engine request cancelled at once, long before the
// stream's write timeout.
func TestHostileEngineClientNeverReads(t *testing.T) {
	for _, proto := range []string{"http", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			b := cmdtest.StartBroker(t, "--answer-buffer-bytes", fmt.Sprint(4*mib), "--stream-write-timeout", "10m")
			var ends engineEnds
			e := hostileEngine(t, endless(200<<10, -1, &ends))
			startAgent(t, b.NATS, "a1", e, 2)
			cmdtest.WaitEligible(t, b.HTTP, "a1")
			peak := heapPeak(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			switch proto {
			case "http":
				conn, err := net.Dial("tcp", strings.TrimPrefix(b.HTTP, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}],"stream":true}`, model)
				fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			case "grpc":
				cc, err := grpc.NewClient(b.GRPC, grpcInsecure(), grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
				if err != nil {
					t.Fatal(err)
				}
				defer cc.Close()
				if _, err := switchyardv1.NewSwitchyardClient(cc).Chat(ctx, &switchyardv1.ChatRequest{
					Model: model, Messages: []*switchyardv1.Message{{Role: "user", Content: "x"}},
				}); err != nil {
					t.Fatal(err)
				}
			}
			waitCancelled(t, &ends, 1)
			grown := peak()
			// The buffer, the chunks in flight when it filled, and the
			// socket's and HTTP/2's buffers.
			if limit := uint64(64 * mib); grown > limit {
				t.Fatalf("heap grew by %d MiB for a client that never reads, want at most %d MiB", grown/mib, limit/mib)
			}
			t.Logf("heap grew by %d MiB", grown/mib)
		})
	}
}

// toolCallEvents answers a completion with events chat chunks, each
// opening per new tool calls (or choices), then [DONE].
func toolCallEvents(events, per int, choices bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for ev := range events {
			var b strings.Builder
			b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"` + model + `","choices":[`)
			for i := range per {
				if i > 0 {
					b.WriteByte(',')
				}
				n := ev*per + i
				if choices {
					fmt.Fprintf(&b, `{"index":%d,"delta":{"content":"a"}}`, n)
				} else if i == 0 {
					fmt.Fprintf(&b, `{"index":0,"delta":{"tool_calls":[{"index":%d,"id":"t","function":{"name":"f","arguments":"x"}}`, n)
				} else {
					fmt.Fprintf(&b, `{"index":%d,"id":"t","function":{"name":"f","arguments":"x"}}`, n)
				}
			}
			if !choices {
				b.WriteString(`]}}`)
			}
			b.WriteString("]}\n\n")
			if _, err := io.WriteString(w, b.String()); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

// TestHostileEngineManyIndexes: an engine whose events open thousands of
// new choices or tool calls each is refused when the client waits for a
// whole answer (502 engine_output_too_large, the engine request
// cancelled), instead of an assembly whose cost grows with the square of
// the indexes.
func TestHostileEngineManyIndexes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		choices bool
		per     int
	}{
		{"tool calls", false, 3000},
		{"choices", true, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := cmdtest.StartBroker(t)
			e := hostileEngine(t, toolCallEvents(20, tc.per, tc.choices))
			startAgent(t, b.NATS, "a1", e, 2)
			cmdtest.WaitEligible(t, b.HTTP, "a1")
			st, data := postChat(t, b.HTTP, false)
			if st != http.StatusBadGateway || errorCode(data) != "engine_output_too_large" {
				t.Fatalf("client got %d %.300s, want 502 engine_output_too_large", st, data)
			}
		})
	}
}

// stallAfter answers a completion with tokens, then does what stall says
// until the request goes: nothing, SSE comments, or one byte of an event
// a second. Requests are counted by their X-Request-Id in seen.
func stallAfter(tokens []string, stall string, seen *sync.Map, ends *engineEnds) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n, _ := seen.LoadOrStore(r.Header.Get("X-Request-Id"), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, tok := range tokens {
			_, _ = w.Write(chatEvent(tok))
		}
		_ = rc.Flush()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				ends.cancelled.Add(1)
				return
			case <-tick.C:
			}
			switch stall {
			case "comments":
				_, _ = io.WriteString(w, ": still here\n\n")
			case "trickle":
				_, _ = io.WriteString(w, "d")
			default:
				continue
			}
			_ = rc.Flush()
		}
	}
}

// TestHostileEngineStalls: an engine that sends its headers and then
// nothing, only comments, or a byte at a time, before its first token or
// after some, holds its request only until the agent's progress bound: the
// attempt ends with engine_stalled, the broker retries (or migrates) it on
// the other agent, never on the stalled one again, and the client gets a
// whole answer.
func TestHostileEngineStalls(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []string
		stall  string
	}{
		{"headers then nothing", nil, "nothing"},
		{"only comments", nil, "comments"},
		{"a byte at a time", nil, "trickle"},
		{"silent after a token", []string{"Hello"}, "nothing"},
		{"comments after a token", []string{"Hello"}, "comments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := cmdtest.StartBroker(t, "--retry-limit", "5")
			var seen sync.Map
			var ends engineEnds
			stalled := hostileEngine(t, stallAfter(tc.tokens, tc.stall, &seen, &ends))
			startAgent(t, b.NATS, "stalled", stalled, 4,
				"--engine-first-event-timeout", "500ms", "--engine-progress-timeout", "500ms")
			good := startEngine(t, simengineConfig(model))
			startAgent(t, b.NATS, "good", good, 4)
			cmdtest.WaitEligible(t, b.HTTP, "stalled", "good")
			const requests = 8
			var wg sync.WaitGroup
			results := make([]streamResult, requests)
			for i := range requests {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := rawStream(context.Background(), b.HTTP, fmt.Sprintf("request %d", i), 8)
					if err != nil {
						r.errMsg = err.Error()
					}
					results[i] = r
				}()
			}
			wg.Wait()
			for i, r := range results {
				if !r.done || r.errMsg != "" || r.text == "" {
					t.Errorf("request %d: %+v, want a whole answer", i, r)
				}
			}
			// Each request met the stalled engine at most once: its retry
			// went to the other agent.
			seen.Range(func(k, v any) bool {
				if n := v.(*atomic.Int32).Load(); n > 1 {
					t.Errorf("request %s reached the stalled engine %d times", k, n)
				}
				return true
			})
			if stalled.served.Load() == 0 {
				t.Fatal("no request reached the stalled engine: the test tested nothing")
			}
			testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
				if c, s := ends.cancelled.Load(), stalled.served.Load(); c != s {
					return fmt.Errorf("%d of the stalled engine's %d requests cancelled", c, s)
				}
				return nil
			})
		})
	}
}

// TestHostileEngineErrorBody: an engine's 5xx with a 64 KiB body reaches
// the client as an error whose message quotes a clipped, printable part
// of it, whether the client streams or not.
func TestHostileEngineErrorBody(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := hostileEngine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "<html>\n\x1b[31m"+strings.Repeat("stack frame\n", 64<<10/12)+"</html>")
	})
	startAgent(t, b.NATS, "a1", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	for _, stream := range []bool{false, true} {
		st, data := postChat(t, b.HTTP, stream)
		var body struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		if err := json.Unmarshal(data, &body); err != nil {
			t.Fatalf("stream %v: %d %.300q: %v", stream, st, data, err)
		}
		m := body.Error.Message
		if st < 500 || len(m) > 1024 || !strings.Contains(m, "stack frame") || strings.ContainsAny(m, "\n\x1b") {
			t.Fatalf("stream %v: status %d, message of %d bytes %.200q; want a 5xx quoting at most 512 printable bytes of the engine's", stream, st, len(m), m)
		}
	}
}

// embed posts an embeddings request.
func embed(t *testing.T, base string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Post(base+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"`+model+`","input":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// TestHostileEngineEmbeddings: embeddings meet an engine's faults as chat
// does: an answer larger than a reply can carry is a prompt 502
// engine_output_too_large (not a wait for the request timeout), a 200
// that is not JSON is an engine error (never relayed as
// application/json), and requests that reach their deadline all get a
// 504 with its body.
func TestHostileEngineEmbeddings(t *testing.T) {
	t.Run("too large", func(t *testing.T) {
		b := cmdtest.StartBroker(t, "--nats-max-payload", fmt.Sprint(2*mib))
		e := hostileEngine(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[`+strings.Repeat("0.5,", 1<<20)+`0.5]}]}`)
		})
		startAgent(t, b.NATS, "a1", e, 2)
		cmdtest.WaitEligible(t, b.HTTP, "a1")
		st, _, data := embed(t, b.HTTP)
		if st != http.StatusBadGateway || errorCode(data) != "engine_output_too_large" {
			t.Fatalf("client got %d %.300s, want 502 engine_output_too_large", st, data)
		}
	})
	t.Run("html", func(t *testing.T) {
		b := cmdtest.StartBroker(t)
		e := hostileEngine(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html><body>maintenance</body></html>")
		})
		startAgent(t, b.NATS, "a1", e, 2)
		cmdtest.WaitEligible(t, b.HTTP, "a1")
		st, h, data := embed(t, b.HTTP)
		if st < 500 || errorCode(data) != "engine_error" || strings.Contains(string(data), "<html>") || h.Get("Content-Type") != "application/json" {
			t.Fatalf("client got %d %s %.300s, want a 5xx engine_error in OpenAI's shape", st, h.Get("Content-Type"), data)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		b := cmdtest.StartBroker(t, "--request-timeout", "1s")
		e := hostileEngine(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		})
		startAgent(t, b.NATS, "a1", e, 16)
		cmdtest.WaitEligible(t, b.HTTP, "a1")
		const requests = 9
		var wg sync.WaitGroup
		for i := range requests {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, _, data := embed(t, b.HTTP)
				if st != http.StatusGatewayTimeout || errorCode(data) != "timeout" {
					t.Errorf("request %d: %d %.300q, want 504 timeout with its body", i, st, data)
				}
			}()
		}
		wg.Wait()
	})
}
