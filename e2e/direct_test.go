package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/simengine"
)

// directTokens reads switchyard_direct_token_chunks_total.
func directTokens(t *testing.T, base string) int {
	t.Helper()
	v := scrapeValue(base+"/metrics", "switchyard_direct_token_chunks_total")
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("switchyard_direct_token_chunks_total %q: %v", v, err)
	}
	return int(n)
}

// TestDirectTokenWrites: on the broker's own HTTP/1.1 loop the tokens of a
// stream after its first are written by the reply goroutine (counted by
// switchyard_direct_token_chunks_total), and the client gets every byte the
// engine made, in order; a client with a tiny receive window that stops
// reading mid-stream makes those writes wait in the writer, and the
// handler writes them when the client reads again: nothing lost, nothing
// twice. With --http-loop=false nothing goes that way.
func TestDirectTokenWrites(t *testing.T) {
	for _, loop := range []bool{true, false} {
		t.Run(fmt.Sprintf("http-loop=%v", loop), func(t *testing.T) {
			b := startBroker(t, fmt.Sprintf("--http-loop=%v", loop))
			e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 2 * time.Millisecond, Slots: 4})
			startAgent(t, b.NATS, "a1", e, 4)
			waitEligible(t, b.HTTP, "a1")
			const tokens = 40
			want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":"direct"}],"max_tokens":%d}`, tokens))

			before := directTokens(t, b.HTTP)
			r, err := rawStream(context.Background(), b.HTTP, "direct", tokens)
			if err != nil || !r.done || r.text != want.Text {
				t.Fatalf("stream: %v, done %v, text %q, want %q", err, r.done, r.text, want.Text)
			}
			direct := directTokens(t, b.HTTP) - before
			if !loop {
				if direct != 0 {
					t.Fatalf("%d tokens written directly on net/http", direct)
				}
				return
			}
			// The reader is not always parked when a token comes (it may be
			// writing the one before): most, not all, go directly.
			if direct < tokens/2 {
				t.Fatalf("%d of %d tokens written by the reply goroutine, want most", direct, tokens)
			}

			// A slow client: a receive window of a few KiB, and a pause
			// long enough for the broker's send buffer to fill.
			long := 600
			want = expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":"slow"}],"max_tokens":%d}`, long))
			text, err := slowStream(b.HTTP, "slow", long, 300*time.Millisecond)
			if err != nil || text != want.Text {
				t.Fatalf("slow client: %v, %d bytes of text, want %d (equal: %v)", err, len(text), len(want.Text), text == want.Text)
			}
		})
	}
}

// slowStream streams a chat completion on a connection with a small
// receive buffer, pausing after the first token, and returns the text.
func slowStream(base, prompt string, maxTokens int, pause time.Duration) (string, error) {
	d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	resp, err := (&http.Client{Transport: tr}).Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var text strings.Builder
	paused := false
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			return text.String(), fmt.Errorf("stream ended without [DONE]")
		}
		if err != nil {
			return text.String(), err
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
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
		if !paused && text.Len() > 0 {
			paused = true
			time.Sleep(pause)
		}
	}
}
