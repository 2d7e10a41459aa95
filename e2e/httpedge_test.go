package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/simengine"
)

// TestStreamSlowClient: the client gets every byte the engine made, in
// order; a client with a tiny receive window that stops reading
// mid-stream makes the handler's writes wait, and it gets the rest when
// it reads again: nothing lost, nothing twice.
func TestStreamSlowClient(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 2 * time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	const tokens = 40
	want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":"direct"}],"max_tokens":%d}`, tokens))
	text, arrivals, err := timedStream(b.HTTP, "direct", tokens, 0, 0)
	if err != nil || text != want.Text {
		t.Fatalf("stream: %v, text %q, want %q", err, text, want.Text)
	}
	t.Logf("%d content events for %d tokens", len(arrivals), tokens)

	// A slow client: a receive window of a few KiB, and a pause long
	// enough for the broker's send buffer to fill.
	long := 600
	want = expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":"slow"}],"max_tokens":%d}`, long))
	text, _, err = timedStream(b.HTTP, "slow", long, 4096, 300*time.Millisecond)
	if err != nil || text != want.Text {
		t.Fatalf("slow client: %v, %d bytes of text, want %d (equal: %v)", err, len(text), len(want.Text), text == want.Text)
	}
}

// TestStreamHead: a stream whose engine is slow to its first token gets
// the stream's headers, the route and agent its accepted chunk named, and
// the whole text.
func TestStreamHead(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: 40 * time.Millisecond, ITL: time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	for i := range 3 {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"first %d"}],"max_tokens":1,"stream":true}`, model, i)
		want := expect(t, simengine.APIChat, body)
		resp, err := http.Post(b.HTTP+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		text, err := readStreamText(resp.Body, nil)
		resp.Body.Close()
		h := resp.Header
		if err != nil || text != want.Text || resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: status %d, %v, text %q, want %q", i, resp.StatusCode, err, text, want.Text)
		}
		if h.Get("Content-Type") != "text/event-stream" || h.Get("Cache-Control") != "no-cache" ||
			h.Get("X-Switchyard-Agent") != "a1" || h.Get("X-Switchyard-Route") != "regular" || h.Get("X-Request-Id") == "" {
			t.Fatalf("stream %d: head %v", i, h)
		}
	}
}

// timedStream streams a chat completion and returns its text and when
// each content event arrived. With rcvbuf, the connection's receive
// buffer is that small; with pause, the client stops reading that long
// after the first token.
func timedStream(base, prompt string, maxTokens, rcvbuf int, pause time.Duration) (string, []time.Time, error) {
	d := &net.Dialer{}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	resp, err := (&http.Client{Transport: tr}).Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	var arrivals []time.Time
	text, err := readStreamText(resp.Body, func() {
		arrivals = append(arrivals, time.Now())
		if pause > 0 && len(arrivals) == 1 {
			time.Sleep(pause)
		}
	})
	return text, arrivals, err
}

// TestLongConversationKeptAlive: a multi-turn chat on one kept-alive
// connection, each turn re-sending the whole conversation (a system
// prompt of some thousand words, long user turns, the answers): bodies
// from 8 KiB to past 64 KiB, each longer than the last, as a chat client
// sends them. Every turn is answered in full on the same connection.
func TestLongConversationKeptAlive(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 2})
	startAgent(t, b.NATS, "a1", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	var conns atomic.Int32
	tr := &http.Transport{DialContext: func(ctx context.Context, n, a string) (net.Conn, error) {
		conns.Add(1)
		return (&net.Dialer{}).DialContext(ctx, n, a)
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", strings.Repeat("you are a careful assistant that answers briefly and well ", 150)}}
	const turns = 12
	for turn := range turns {
		msgs = append(msgs, msg{"user", fmt.Sprintf("turn %d: %s", turn, strings.Repeat("tell me more about the long road ", 150))})
		body, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 16, "stream": true})
		want := expect(t, simengine.APIChat, string(body))
		resp, err := client.Post(b.HTTP+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("turn %d (%d bytes): %v", turn, len(body), err)
		}
		text, err := readStreamText(resp.Body, nil)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || text != want.Text {
			t.Fatalf("turn %d (%d bytes): status %d, %v, text %q, want %q", turn, len(body), resp.StatusCode, err, text, want.Text)
		}
		msgs = append(msgs, msg{"assistant", text})
	}
	if last := len(msgs); last < 2*turns {
		t.Fatalf("%d messages", last)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d turns on %d connections, want 1", turns, n)
	}
}

// TestBadTargetAnswered: a request whose target is no URL (a bad escape)
// gets a 400 at once, not a wait for the client's timeout.
func TestBadTargetAnswered(t *testing.T) {
	b := cmdtest.StartBroker(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(b.HTTP, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "POST /v1/chat/completions%%zz HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
}

// readStreamText reads a chat stream to its [DONE] and returns its text;
// each, when not nil, is called as each event with content arrives.
func readStreamText(r io.Reader, each func()) (string, error) {
	br := bufio.NewReader(r)
	var text strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return text.String(), fmt.Errorf("stream ended without [DONE]: %w", err)
		}
		payload, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: ")
		if !ok {
			continue
		}
		if payload == "[DONE]" {
			return text.String(), nil
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			return text.String(), err
		}
		before := text.Len()
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
		if each != nil && text.Len() > before {
			each()
		}
	}
}
