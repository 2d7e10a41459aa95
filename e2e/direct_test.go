package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
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
// engine made, in order and as it was made (not held back in bunches); a client with a tiny receive window that stops
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
			text, arrivals, err := timedStream(b.HTTP, "direct", tokens, 0, 0)
			if err != nil || text != want.Text {
				t.Fatalf("stream: %v, text %q, want %q", err, text, want.Text)
			}
			direct := directTokens(t, b.HTTP) - before
			// Tokens reach the client as the engine makes them (2 ms
			// apart), not held back and sent in bunches.
			var gaps []time.Duration
			for i := 1; i < len(arrivals); i++ {
				gaps = append(gaps, arrivals[i].Sub(arrivals[i-1]))
			}
			slices.Sort(gaps)
			if len(gaps) < tokens/2 || gaps[len(gaps)/2] < 500*time.Microsecond {
				t.Fatalf("tokens arrived bunched: %d gaps, median %s", len(gaps), gaps[len(gaps)/2])
			}
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
			text, _, err = timedStream(b.HTTP, "slow", long, 4096, 300*time.Millisecond)
			if err != nil || text != want.Text {
				t.Fatalf("slow client: %v, %d bytes of text, want %d (equal: %v)", err, len(text), len(want.Text), text == want.Text)
			}
		})
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
	br := bufio.NewReader(resp.Body)
	var text strings.Builder
	var arrivals []time.Time
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			return text.String(), arrivals, fmt.Errorf("stream ended without [DONE]")
		}
		if err != nil {
			return text.String(), arrivals, err
		}
		payload, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: ")
		if !ok {
			continue
		}
		if payload == "[DONE]" {
			return text.String(), arrivals, nil
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			return text.String(), arrivals, err
		}
		before := text.Len()
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
		if text.Len() > before {
			arrivals = append(arrivals, time.Now())
		}
		if pause > 0 && len(arrivals) == 1 && text.Len() > before {
			time.Sleep(pause)
		}
	}
}
