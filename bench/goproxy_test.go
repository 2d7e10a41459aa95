package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestGoProxyRoundRobinStreams sends requests through the Go proxy to two
// engines that stream: each engine gets every other request, and a chunk
// reaches the client while its engine is still holding the stream open
// (the proxy flushes each chunk, as an SSE front end must).
func TestGoProxyRoundRobinStreams(t *testing.T) {
	release := make(chan struct{})
	engine := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s %s\n\n", name, r.URL.Path)
			w.(http.Flusher).Flush()
			if r.URL.Path == "/hold" {
				<-release
			}
			fmt.Fprintf(w, "data: [DONE]\n\n")
		}))
	}
	a, b := engine("a"), engine("b")
	defer a.Close()
	defer b.Close()
	p, err := newGoProxy([]string{a.Listener.Addr().String(), b.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(fullDuplex(p))
	defer front.Close()

	var got []string
	for range 4 {
		resp, err := http.Get(front.URL + "/v1/chat/completions")
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Fields(line)[1])
	}
	if strings.Join(got, "") != "abab" {
		t.Fatalf("engines in turn: got %v, want a b a b", got)
	}

	resp, err := http.Get(front.URL + "/hold")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first chunk %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first chunk did not reach the client while the engine held the stream: not flushed")
	}
	close(release)
}

func TestGoProxyBadUpstreams(t *testing.T) {
	if _, err := newGoProxy(nil); err == nil {
		t.Fatal("no upstreams: want an error")
	}
	if _, err := newGoProxy([]string{"127.0.0.1:1", "/nohost"}); err == nil {
		t.Fatal("an upstream without a host: want an error")
	}
}

// TestGoProxyBodyAfterResponseHead: an engine that answers before it has
// read the whole request body still gets that body, and the client its
// whole stream. Go's HTTP/1 server closes a request's body when the
// response head is written unless the handler enables full duplex; the
// proxy's Transport then fails to read the rest and cuts the engine's
// connection, answer and all (golang/go#40747). Here the client sends
// its body only after the first chunk has reached it, so without full
// duplex the proxy never sends the head (its server waits for the body
// first) and the client's timeout ends the test.
func TestGoProxyBodyAfterResponseHead(t *testing.T) {
	// The engine answers before it reads the body, so its own server must
	// not wait for the body before the head either.
	engine := httptest.NewServer(fullDuplex(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: head\n\n")
		w.(http.Flusher).Flush()
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "data: %d bytes %v\n\ndata: [DONE]\n\n", len(b), err)
	})))
	defer engine.Close()
	p, err := newGoProxy([]string{engine.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(fullDuplex(p))
	defer front.Close()

	body := strings.Repeat("x", 1000)
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, front.URL+"/v1/chat/completions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: head\n" {
		t.Fatalf("first chunk %q, %v", line, err)
	}
	if _, err := io.WriteString(pw, body); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("the stream after the body was sent: %q, %v", rest, err)
	}
	if want := "\ndata: 1000 bytes <nil>\n\ndata: [DONE]\n\n"; string(rest) != want {
		t.Fatalf("the stream after the body was sent: %q, want %q", rest, want)
	}
}
