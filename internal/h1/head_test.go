package h1

import (
	"bufio"
	"bytes"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

var headSeeds = []string{
	"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8080\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n",
	"POST /fast HTTP/1.1\r\nhost: x\r\nx-request-id: abc\r\nAUTHORIZATION: Bearer k\r\nContent-Length: 0\r\n\r\n",
	"POST /fast HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: keep-alive, close\r\n\r\n",
	"POST /fast HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\nX-Empty:\r\nX-Tab:\tv\t\r\n\r\n",
	"GET /x?y=1 HTTP/1.1\r\nHost: [::1]:80\r\nUser-Agent: OpenAI/Python 1.0\r\n\r\n",
	"POST /fast HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
	"POST /fast HTTP/1.1\r\nHost: x y\r\n\r\n",
	"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n",
	"POST http://x/fast HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST /fast HTTP/1.0\r\nHost: x\r\n\r\n",
	"POST /fast HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
	"POST /fast HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n",
}

// FuzzParseHead: every head parseHead takes, net/http takes too, with the
// same method, target, host, header fields and body length; and the
// heads it refuses are left to net/http. A target that is no URL (a bad
// escape) passes parseHead, and the request's URL parse hands it to
// net/http (conn.request): such a head is served as one parseHead
// refused.
func FuzzParseHead(f *testing.F) {
	for _, s := range headSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := parseHead(b, 64<<10)
		if !ok {
			return
		}
		if _, err := url.ParseRequestURI(h.target); err != nil {
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:h.size])))
		if err != nil {
			t.Fatalf("parseHead took %q, net/http refused it: %v", b[:h.size], err)
		}
		if req.Method != h.method || req.RequestURI != h.target || req.Host != h.host {
			t.Fatalf("%q: method %q target %q host %q, net/http %q %q %q", b, h.method, h.target, h.host, req.Method, req.RequestURI, req.Host)
		}
		if req.ContentLength != h.contentLength || req.Close != h.close {
			t.Fatalf("%q: length %d close %v, net/http %d %v", b, h.contentLength, h.close, req.ContentLength, req.Close)
		}
		delete(req.Header, "Host") // as the server does
		if !maps.EqualFunc(req.Header, h.header, slices.Equal) {
			t.Fatalf("%q: header %v, net/http %v", b, h.header, req.Header)
		}
		// net/http's server takes the token in any case (hasToken).
		if expects := strings.EqualFold(req.Header.Get("Expect"), "100-continue"); expects != h.expectContinue {
			t.Fatalf("%q: expect continue %v", b, h.expectContinue)
		}
		// net/http's server refuses what its request reader takes but a
		// server must not: an invalid Host, no Host.
		if len(req.Header["Transfer-Encoding"]) > 0 || req.ProtoMinor != 1 {
			t.Fatalf("%q: taken with %v, HTTP/1.%d", b, req.TransferEncoding, req.ProtoMinor)
		}
	})
}

// TestParseHeadRefuses: what is left to net/http.
func TestParseHeadRefuses(t *testing.T) {
	for _, s := range headSeeds[5:] {
		if _, ok := parseHead([]byte(s), 64<<10); ok {
			t.Errorf("parseHead took %q", s)
		}
	}
	for _, s := range headSeeds[:5] {
		if _, ok := parseHead([]byte(s), 64<<10); !ok {
			t.Errorf("parseHead refused %q", s)
		}
	}
}

// TestParseHeadAllocs: a client's usual head (six fields) costs a fixed
// few allocations, whatever its number of fields: the head's text, its
// struct, the header map, and one array for all the values.
func TestParseHeadAllocs(t *testing.T) {
	b := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 120\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\nX-Request-Id: r-1\r\n\r\n")
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := parseHead(b, 64<<10); !ok {
			t.Fatal("refused")
		}
	})
	if allocs > 5 {
		t.Fatalf("%.0f allocations for a head of six fields, want at most 5", allocs)
	}
}

// BenchmarkParseHead is one usual request head.
func BenchmarkParseHead(b *testing.B) {
	head := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 120\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\nX-Request-Id: r-1\r\n\r\n")
	b.ReportAllocs()
	for b.Loop() {
		parseHead(head, 64<<10)
	}
}
