package openai

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// cannedEngine answers every request on a connection with answer, reading
// each request (its head, then Content-Length bytes) into one buffer: it
// allocates nothing per request, so a count of allocations is the
// adapter's. With bodyAfter > 0 the answer's body follows its head that
// much later, as an engine's tokens do: the adapter reads it apart.
func cannedEngine(t *testing.T, answer string, bodyAfter time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				out := []byte(answer)
				headLen := len(out)
				if bodyAfter > 0 {
					headLen = bytes.Index(out, []byte("\r\n\r\n")) + 4
				}
				buf := make([]byte, 64<<10)
				n := 0
				for {
					end := bytes.Index(buf[:n], []byte("\r\n\r\n"))
					if end >= 0 {
						head := buf[:end]
						i := bytes.Index(head, []byte("Content-Length: "))
						j := i + len("Content-Length: ")
						k := j + bytes.IndexByte(head[j:], '\r')
						if k < j {
							k = len(head)
						}
						length := 0
						for _, d := range head[j:k] {
							length = 10*length + int(d-'0')
						}
						if total := end + 4 + length; n >= total {
							if _, err := c.Write(out[:headLen]); err != nil {
								return
							}
							if headLen < len(out) {
								time.Sleep(bodyAfter)
								if _, err := c.Write(out[headLen:]); err != nil {
									return
								}
							}
							n = copy(buf, buf[total:n])
							continue
						}
					}
					m, err := c.Read(buf[n:])
					if err != nil {
						return
					}
					n += m
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// One engine call on a kept-alive connection, to the end of a short
// streamed answer, allocates little: the answer's head (six: its status
// line, the answer, its header map's two, the values' array, the date),
// its body, the adapter's stream and the cancel's registration (two with
// context.AfterFunc, one with an agent's job context). The request, its
// wait and the events reuse the connection's buffers.
func TestStreamCallAllocs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bodyAfter time.Duration
	}{
		{"body with the head", 0},
		// The body read on the socket itself (pumpRaw).
		{"body after the head", time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) { testStreamCallAllocs(t, tc.bodyAfter) })
	}
}

func testStreamCallAllocs(t *testing.T, bodyAfter time.Duration) {
	sse := "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" hi\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: [DONE]\n\n"
	answer := "HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 17:47:50 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n" +
		strconv.FormatInt(int64(len(sse)), 16) + "\r\n" + sse + "\r\n0\r\n\r\n"
	a, err := New(cannedEngine(t, answer, bodyAfter), 1)
	if err != nil {
		t.Fatal(err)
	}
	req := &agent.Request{API: wire.API_API_CHAT, Body: []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`)}
	events := 0
	emit := func(c []byte, _ bool) error { events++; return nil }
	call := func() {
		if err := a.Stream(context.Background(), req, emit); err != nil {
			t.Fatal(err)
		}
	}
	call() // the connection, its buffers
	events = 0
	allocs := testing.AllocsPerRun(100, call)
	t.Logf("an engine call: %.1f allocations", allocs)
	if events != 3*101 {
		t.Fatalf("%d events in 101 calls, want 3 each", events)
	}
	if allocs > 10 {
		t.Fatalf("an engine call: %.1f allocations, want at most 10", allocs)
	}
}
