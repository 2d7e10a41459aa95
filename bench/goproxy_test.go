package main

import (
	"bufio"
	"fmt"
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
	front := httptest.NewServer(p)
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
