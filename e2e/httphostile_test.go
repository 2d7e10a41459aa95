package e2e

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// The tests below speak HTTP/1.1 on raw sockets to the broker command, as
// a hostile or broken client would.

const edgeKey = "sk-edge-test-key"

// dialBroker opens a raw connection to b's HTTP listener; every read and
// write fails after 20s rather than hang the test.
func dialBroker(t *testing.T, b *cmdtest.Broker) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(b.HTTP, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// readAnswer reads one response from br, its body whole, and its error
// code when the body is an OpenAI error.
func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, string, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("answer %d: body: %v", resp.StatusCode, err)
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return resp, string(body), e.Error.Code
}

// closedAfter asserts that the broker closes c after its answer: the next
// read sees the end of the connection (or its reset), not a timeout.
func closedAfter(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	_, err := br.ReadByte()
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("connection still open after the answer: %v", err)
	}
}

// TestUnreadBodyAnsweredAtOnce: a body trickled a byte at a time to a
// handler that does not read it (the 401 of a missing key, a 405, a GET
// route) is answered before the body is complete, with no 100 Continue,
// and the connection closed.
func TestUnreadBodyAnsweredAtOnce(t *testing.T) {
	b := cmdtest.StartBroker(t, "--api-key", edgeKey)
	for _, tc := range []struct {
		name, head string
		status     int
	}{
		{"missing key", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Type: application/json\r\n", http.StatusUnauthorized},
		{"method", "PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + edgeKey + "\r\n", http.StatusMethodNotAllowed},
		{"get route", "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + edgeKey + "\r\n", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialBroker(t, b)
			const size = 2000
			fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n", tc.head, size)
			sent := make(chan int, 1)
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				n := 0
				defer func() { sent <- n }()
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for n < size {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					if _, err := c.Write([]byte("x")); err != nil {
						return
					}
					n++
				}
			}()
			br := bufio.NewReader(c)
			resp, _, _ := readAnswer(t, br)
			stop <- struct{}{}
			n := <-sent
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if n >= size {
				t.Fatalf("answered only once the whole body (%d bytes) was in", n)
			}
			t.Logf("answered %d after %d of %d body bytes", resp.StatusCode, n, size)
			closedAfter(t, c, br)
		})
	}
}

// TestDeclaredLengthCostsNothing: connections that declare a body of
// almost --max-body and send a byte of it cost the broker about what they
// sent, not what they declared, with a key (until their body times out)
// or without one (401 at once).
func TestDeclaredLengthCostsNothing(t *testing.T) {
	b := cmdtest.StartBroker(t, "--api-key", edgeKey, "--max-body", "8000000", "--read-body-timeout", "1s")
	const conns = 12
	const declared = 7_900_000
	allocated := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := allocated()
	var readers []*bufio.Reader
	for i := range conns {
		c := dialBroker(t, b)
		auth := ""
		if i%2 == 0 {
			auth = "Authorization: Bearer " + edgeKey + "\r\n"
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", auth, declared)
		readers = append(readers, bufio.NewReader(c))
	}
	// Every request is answered: the keyed ones once their handlers read
	// what came of their bodies and gave up.
	for i, br := range readers {
		resp, body, _ := readAnswer(t, br)
		want := http.StatusRequestTimeout
		if i%2 != 0 {
			want = http.StatusUnauthorized
		}
		if resp.StatusCode != want {
			t.Fatalf("connection %d: %d %s, want %d", i, resp.StatusCode, body, want)
		}
	}
	grown := allocated() - before
	t.Logf("%d KiB allocated for %d connections declaring %d bytes each", grown>>10, conns, declared)
	if grown > 2*declared {
		t.Fatalf("%d bytes allocated for %d connections that sent one byte each", grown, conns)
	}
}

// TestBodyReadTimeout: a body that stops coming is answered 408 after
// --read-body-timeout, and the connection closed.
func TestBodyReadTimeout(t *testing.T) {
	b := cmdtest.StartBroker(t, "--read-body-timeout", "300ms")
	c := dialBroker(t, b)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	br := bufio.NewReader(c)
	resp, body, code := readAnswer(t, br)
	if resp.StatusCode != http.StatusRequestTimeout || code != "body_timeout" {
		t.Fatalf("status %d %s, want 408 body_timeout", resp.StatusCode, body)
	}
	closedAfter(t, c, br)
}

// TestSilentConnectionClosed: a connection that sends nothing, or half a
// head, is closed after --read-header-timeout.
func TestSilentConnectionClosed(t *testing.T) {
	b := cmdtest.StartBroker(t, "--read-header-timeout", "300ms")
	for _, sent := range []string{"", "GET /healthz HTTP/1.1\r\nHost:"} {
		c := dialBroker(t, b)
		io.WriteString(c, sent)
		at := time.Now()
		_, err := io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("sent %q: still open after %s", sent, time.Since(at))
		}
		t.Logf("sent %q: closed after %s", sent, time.Since(at).Round(time.Millisecond))
	}
}

// TestMaxConns: past --max-conns a new connection gets a 503 and is
// closed; once one closes, a new one is served again.
func TestMaxConns(t *testing.T) {
	b := cmdtest.StartBroker(t, "--max-conns", "2")
	// The harness's probe may hold a kept-alive connection; once it is
	// closed the broker frees its slot, soon.
	cmdtest.CloseIdleProbes()
	http.DefaultClient.CloseIdleConnections()
	// hold opens a connection and has it answer /healthz; it stays open
	// (kept alive) when the answer is 200.
	hold := func() (net.Conn, int, string) {
		c := dialBroker(t, b)
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			return nil, 0, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			c.Close()
		}
		return c, resp.StatusCode, string(body)
	}
	var held []net.Conn
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		c, status, body := hold()
		if status != http.StatusOK {
			return fmt.Errorf("connection %d of 2: %d %s", len(held)+1, status, body)
		}
		if held = append(held, c); len(held) < 2 {
			return errors.New("one connection held")
		}
		return nil
	})
	// Both slots are held: a third connection is refused.
	if _, status, body := hold(); status != http.StatusServiceUnavailable || !strings.Contains(body, "too_many_connections") {
		t.Fatalf("third connection: %d %s, want 503 too_many_connections", status, body)
	}
	held[1].Close()
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if _, status, body := hold(); status != http.StatusOK {
			return fmt.Errorf("after a close: %d %s, want 200", status, body)
		}
		return nil
	})
}

// TestChunkedWithLengthClosed: a request with both Transfer-Encoding and
// Content-Length gets one answer, its body read by its chunks, and its
// connection is closed (RFC 9112 section 6.1): the request pipelined
// behind it is never served.
func TestChunkedWithLengthClosed(t *testing.T) {
	b := cmdtest.StartBroker(t)
	c := dialBroker(t, b)
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n2\r\n{}\r\n0\r\n\r\n"+
		"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, body, code := readAnswer(t, br)
	// The chunked body, {}, names no message: a 400 of the request format.
	if resp.StatusCode != http.StatusBadRequest || code == "" || !resp.Close {
		t.Fatalf("status %d (close %v) %s, want a 400 of the body {} and the connection closed", resp.StatusCode, resp.Close, body)
	}
	closedAfter(t, c, br)
}

// TestBodyTooLarge: a body past --max-body is answered 413 and the
// connection closed.
func TestBodyTooLarge(t *testing.T) {
	b := cmdtest.StartBroker(t, "--max-body", "1000")
	c := dialBroker(t, b)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(c)
	resp, got, code := readAnswer(t, br)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || code != "body_too_large" {
		t.Fatalf("status %d %s, want 413 body_too_large", resp.StatusCode, got)
	}
	closedAfter(t, c, br)
}

// TestRequestTimeoutAnswered: a non-streaming request that reaches
// --request-timeout gets its 504.
func TestRequestTimeoutAnswered(t *testing.T) {
	b := cmdtest.StartBroker(t, "--request-timeout", "700ms")
	e := startEngine(t, simengine.Config{Model: model, TTFT: 30 * time.Second, ITL: time.Millisecond, Slots: 2})
	startAgent(t, b.NATS, "a1", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	c := dialBroker(t, b)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"too slow"}],"max_tokens":4}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, got, code := readAnswer(t, bufio.NewReader(c))
	if resp.StatusCode != http.StatusGatewayTimeout || code != "timeout" {
		t.Fatalf("status %d %s, want 504 timeout", resp.StatusCode, got)
	}
}

// chatRequest is a raw non-streaming chat completion request for body.
func chatRequest(body string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// answerText is the content of a non-streaming chat answer.
func answerText(t *testing.T, body string) string {
	t.Helper()
	var r struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("answer %q: %v", body, err)
	}
	return r.Choices[0].Message.Content
}

// TestPipelinedAndLongBodies: requests pipelined on one connection, and
// bodies of 5 MB, several on one kept-alive connection, are all answered
// in order and in full.
func TestPipelinedAndLongBodies(t *testing.T) {
	b := cmdtest.StartBroker(t, "--max-body", "6000000")
	startAgent(t, b.NATS, "a1", fastEngine(t, 4), 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	t.Run("pipelined", func(t *testing.T) {
		c := dialBroker(t, b)
		var all strings.Builder
		var bodies []string
		for i := range 4 {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"pipelined %d"}],"max_tokens":%d}`, model, i, 3+i)
			bodies = append(bodies, body)
			all.WriteString(chatRequest(body))
		}
		io.WriteString(c, all.String())
		br := bufio.NewReader(c)
		for i, body := range bodies {
			resp, got, _ := readAnswer(t, br)
			if want := expect(t, simengine.APIChat, body).Text; resp.StatusCode != http.StatusOK || answerText(t, got) != want {
				t.Fatalf("request %d: %d %q, want %q", i, resp.StatusCode, got, want)
			}
		}
	})
	t.Run("5MB bodies", func(t *testing.T) {
		c := dialBroker(t, b)
		_ = c.SetDeadline(time.Now().Add(2 * time.Minute)) // three 5 MB bodies under the race detector
		br := bufio.NewReader(c)
		for i := range 3 {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"long %d %s"}],"max_tokens":4}`, model, i, strings.Repeat("words of a long prompt ", 5_000_000/23))
			io.WriteString(c, chatRequest(body))
			resp, got, _ := readAnswer(t, br)
			if want := expect(t, simengine.APIChat, body).Text; resp.StatusCode != http.StatusOK || answerText(t, got) != want {
				t.Fatalf("request %d (%d bytes): %d %.200q, want %q", i, len(body), resp.StatusCode, got, want)
			}
		}
	})
}

// TestHangUpCancelsNonStreaming: a client that hangs up while its
// non-streaming request runs cancels the engine request (net/http's
// request context ends when the connection does).
func TestHangUpCancelsNonStreaming(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 20 * time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	c := dialBroker(t, b)
	io.WriteString(c, chatRequest(`{"model":"`+model+`","messages":[{"role":"user","content":"hang up on me"}],"max_tokens":500}`))
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if e.current.Load() == 0 {
			return errors.New("not at the engine yet")
		}
		return nil
	})
	at := time.Now()
	c.Close()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if e.Aborted() == 0 {
			return errors.New("engine not aborted")
		}
		return nil
	})
	t.Logf("engine aborted %s after the client hung up", time.Since(at).Round(time.Millisecond))
}

// TestSlowClientStallsNoOther: a streaming client that stops reading holds
// up no other stream of the broker.
func TestSlowClientStallsNoOther(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 8})
	startAgent(t, b.NATS, "a1", e, 8)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	slow := dialBroker(t, b)
	io.WriteString(slow, chatRequest(`{"model":"`+model+`","stream":true,"messages":[{"role":"user","content":"never read"}],"max_tokens":4000}`))
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if e.current.Load() == 0 {
			return errors.New("slow stream not at the engine yet")
		}
		return nil
	})
	for i := range 3 {
		prompt := fmt.Sprintf("beside a slow client %d", i)
		want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":200}`, prompt))
		text, _, err := timedStream(b.HTTP, prompt, 200, 0, 0)
		if err != nil || text != want.Text {
			t.Fatalf("stream %d beside a slow client: %v, text %q, want %q", i, err, text, want.Text)
		}
	}
}

// TestUnreadAnswersCut: a client that pipelines requests and never reads
// the answers is cut off once an answer has waited --write-timeout to be
// written, instead of holding its connection (and the goroutine and
// buffers behind it) for good.
func TestUnreadAnswersCut(t *testing.T) {
	b := cmdtest.StartBroker(t, "--write-timeout", "300ms")
	c := dialBroker(t, b)
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	blob := strings.Repeat("GET /ui/fleet.js HTTP/1.1\r\nHost: x\r\n\r\n", 100)
	at := time.Now()
	_ = c.SetWriteDeadline(at.Add(60 * time.Second))
	var err error
	sent := 0
	for err == nil {
		var n int
		n, err = io.WriteString(c, blob)
		sent += n
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %s (%d bytes of requests sent)", time.Since(at), sent)
	}
	t.Logf("cut off after %s and %d bytes of requests: %v", time.Since(at).Round(time.Millisecond), sent, err)
}

// TestWriteTimeoutFromAnswerStart: the write timeout counts from when an
// answer starts, not from the request: an answer the engine takes longer
// than it to make is written whole, and a kept-alive connection idle for
// longer than it still takes a request that waits for 100 Continue.
func TestWriteTimeoutFromAnswerStart(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	b := cmdtest.StartBroker(t, "--write-timeout", writeTimeout.String())
	e := startEngine(t, simengine.Config{Model: model, TTFT: 5 * writeTimeout, ITL: time.Millisecond, Slots: 2})
	startAgent(t, b.NATS, "a1", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	c := dialBroker(t, b)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body, _ := readAnswer(t, br); resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d %s", resp.StatusCode, body)
	}
	// The deadline /healthz's answer set has passed: a lower bound, not a
	// wait for something to happen.
	time.Sleep(2 * writeTimeout)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"slow to start"}],"max_tokens":5}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("want 100 Continue, got %q %v", line, err)
	}
	if _, err := br.ReadString('\n'); err != nil { // the blank line after it
		t.Fatal(err)
	}
	io.WriteString(c, body)
	resp, got, _ := readAnswer(t, br)
	if want := expect(t, simengine.APIChat, body).Text; resp.StatusCode != http.StatusOK || answerText(t, got) != want {
		t.Fatalf("answer slower than the write timeout: %d %q, want %q", resp.StatusCode, got, want)
	}
	// And a stream whose first token comes later than the write timeout.
	text, _, err := timedStream(b.HTTP, "slow stream", 5, 0, 0)
	if want := expect(t, simengine.APIChat, `{"messages":[{"role":"user","content":"slow stream"}],"max_tokens":5}`); err != nil || text != want.Text {
		t.Fatalf("stream slower than the write timeout: %v %q, want %q", err, text, want.Text)
	}
}

// TestWriteTimeoutHTTP2: over HTTP/2 (TLS), where a write deadline ends
// its stream when it passes, written to or not, an answer the engine takes
// longer than the write timeout to start is still written whole.
func TestWriteTimeoutHTTP2(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	certFile, keyFile := dir+"/cert.pem", dir+"/key.pem"
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	b := cmdtest.StartBroker(t, "--tls-cert", certFile, "--tls-key", keyFile, "--write-timeout", writeTimeout.String())
	e := startEngine(t, simengine.Config{Model: model, TTFT: 5 * writeTimeout, ITL: time.Millisecond, Slots: 2})
	startAgent(t, b.NATS, "a1", e, 2)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	defer client.CloseIdleConnections()
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		resp, err := client.Get(b.HTTP + "/v1/fleet")
		if err != nil {
			return err
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(data), `"eligible":true`) {
			return fmt.Errorf("agent not eligible: %s", data)
		}
		return nil
	})
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"slow over h2"}],"max_tokens":5,"stream":%v}`, model, stream)
		resp, err := client.Post(b.HTTP+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("stream %v: %v", stream, err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
			t.Fatalf("stream %v: %s %d %.200q %v", stream, resp.Proto, resp.StatusCode, data, err)
		}
		want := expect(t, simengine.APIChat, `{"messages":[{"role":"user","content":"slow over h2"}],"max_tokens":5}`).Text
		if !stream && answerText(t, string(data)) != want {
			t.Fatalf("answer %q, want %q", data, want)
		}
		if stream && !strings.HasSuffix(strings.TrimSpace(string(data)), "data: [DONE]") {
			t.Fatalf("stream cut short: %.300q", data)
		}
	}
}
