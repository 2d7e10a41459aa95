package openai

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// The hand-written request is what net/http's server reads as the request
// net/http's client sent: method, path under the base URL's, Host, the
// body and every header the adapter gives an engine. A trace value a
// header cannot carry is left out instead of failing the job (or, worse,
// injecting a header).
func TestWriteRequestAsServerReadsIt(t *testing.T) {
	type seen struct {
		method, path, host, body string
		header                   http.Header
		length                   int64
	}
	got := make(chan seen, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.Host, string(body), r.Header.Clone(), r.ContentLength}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	a, err := New(srv.URL+"/engine/", 2, WithAPIKey("sk-test"))
	if err != nil {
		t.Fatal(err)
	}
	if a.conns == nil {
		t.Fatal("no own connections for a plain-http engine")
	}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"héllo"}]}`
	job := &wire.Job{RequestId: "sy-1", ClientRequestId: "client-7", Trace: map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  "a=1\r\nX-Injected: yes",
	}}
	var text strings.Builder
	err = a.Stream(context.Background(), &agent.Request{API: wire.API_API_CHAT, Body: []byte(body), Job: job}, func(c []byte, _ bool) error {
		text.Write(c)
		return nil
	})
	if err != nil || !strings.Contains(text.String(), `"x"`) {
		t.Fatalf("stream: %q, %v", text.String(), err)
	}
	s := <-got
	u := strings.TrimPrefix(srv.URL, "http://")
	if s.method != http.MethodPost || s.path != "/engine/v1/chat/completions" || s.host != u || s.body != body || s.length != int64(len(body)) {
		t.Fatalf("server read %s %s Host %s, %d bytes %q", s.method, s.path, s.host, s.length, s.body)
	}
	want := map[string]string{
		"Content-Type":  "application/json",
		"Accept":        "text/event-stream",
		"Authorization": "Bearer sk-test",
		"X-Request-Id":  "client-7",
		"Traceparent":   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"User-Agent":    "Go-http-client/1.1",
	}
	for k, v := range want {
		if g := s.header.Get(k); g != v {
			t.Errorf("%s: %q, want %q", k, g, v)
		}
	}
	for _, k := range []string{"Tracestate", "X-Injected"} {
		if v, ok := s.header[k]; ok {
			t.Errorf("%s sent: %q", k, v)
		}
	}
}

// An API key no header can carry is refused when the adapter is made, not
// at every request.
func TestNewRefusesUnsendableKey(t *testing.T) {
	if _, err := New("http://127.0.0.1:1", 1, WithAPIKey("sk-1\r\nX-Injected: yes")); err == nil {
		t.Fatal("a key with CRLF was taken")
	}
	if _, err := New("http://127.0.0.1:1", 1, WithAPIKey("sk-\tok")); err != nil {
		t.Fatalf("a key with a tab (a valid header value) was refused: %v", err)
	}
}

// rawEngine answers each request on a connection with the next of
// answers, written as given, and counts its connections.
type rawEngine struct {
	ln      net.Listener
	answers []string
	mu      sync.Mutex
	conns   []net.Conn
}

func newRawEngine(t *testing.T, answers ...string) *rawEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &rawEngine{ln: ln, answers: answers}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := 0
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					e.mu.Lock()
					a := e.answers[next%len(e.answers)]
					next++
					e.mu.Unlock()
					if _, err := io.WriteString(c, a); err != nil {
						return
					}
				}
			}()
		}
	}()
	return e
}

func (e *rawEngine) url() string { return "http://" + e.ln.Addr().String() }

func (e *rawEngine) connCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.conns)
}

const sseOK = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"

// Answers framed every way an engine may frame them are read whole, and a
// connection is reused exactly when its answer's end is known: after
// trailers, after a Content-Length body, after an interim answer; not
// after "Connection: close" or a body that runs to the connection's end.
func TestReadResponseFraming(t *testing.T) {
	chunked := func(s string) string {
		return strings.ToUpper(strconvHex(len(s))) + "\r\n" + s + "\r\n0\r\n"
	}
	cases := []struct {
		name, answer string
		reuse        bool
	}{
		{"chunked", "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(sseOK) + "\r\n", true},
		{"chunked with trailers", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(sseOK) + "X-Trailer: 1\r\nX-Other: 2\r\n\r\n", true},
		{"content length", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nContent-Length: " + strconvInt(len(sseOK)) + "\r\n\r\n" + sseOK, true},
		{"bare LF and a folded header", "HTTP/1.1 200 OK\nContent-Type: text/event-stream\nX-Folded: a\n b\nContent-Length: " + strconvInt(len(sseOK)) + "\n\n" + sseOK, true},
		{"early hints first", "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " + strconvInt(len(sseOK)) + "\r\n\r\n" + sseOK, true},
		{"connection close", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\nContent-Length: " + strconvInt(len(sseOK)) + "\r\n\r\n" + sseOK, false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " + strconvInt(len(sseOK)) + "\r\n\r\n" + sseOK, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newRawEngine(t, tc.answer)
			a, err := New(e.url(), 2)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				text, err := streamText(context.Background(), a)
				if err != nil || !strings.Contains(text, `"a"`) {
					t.Fatalf("request %d: %q, %v", i, text, err)
				}
			}
			want := 2
			if tc.reuse {
				want = 1
			}
			if n := e.connCount(); n != want {
				t.Fatalf("2 requests on %d connections, want %d", n, want)
			}
		})
	}
}

// An answer that is not JSON-over-SSE still reaches the job: an error
// status with its message, a JSON object from an engine that ignored
// stream=true; and a malformed head is an engine error, not a hang.
func TestReadResponseAnswers(t *testing.T) {
	errBody := `{"error":{"message":"maximum context length is 8192 tokens","type":"BadRequestError"}}`
	cases := []struct {
		name, answer, want string
		code               string
	}{
		{"400 with a message", "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " + strconvInt(len(errBody)) + "\r\n\r\n" + errBody, "maximum context length", wire.CodeBadRequest},
		{"a JSON answer", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"id\":\"x\"}\n", `{"id":"x"}`, ""},
		{"garbage", "SSH-2.0-OpenSSH_9.6\r\n\r\n", "malformed HTTP answer", wire.CodeEngineDown},
		{"bad header", "HTTP/1.1 200 OK\r\nContent Type: x\r\n\r\n", "malformed HTTP answer", wire.CodeEngineDown},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", "content lengths", wire.CodeEngineDown},
		{"gzip coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "transfer encoding", wire.CodeEngineDown},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 500\r\n\r\n" + sseOK[:20], "reading engine stream", wire.CodeEngine},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					_, _ = io.WriteString(c, tc.answer)
				}
			}()
			a, err := New("http://"+ln.Addr().String(), 1)
			if err != nil {
				t.Fatal(err)
			}
			text, err := streamText(context.Background(), a)
			if tc.code == "" {
				if err != nil || !strings.Contains(text, tc.want) {
					t.Fatalf("got %q, %v; want %q", text, err, tc.want)
				}
				return
			}
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != tc.code || !strings.Contains(we.Message, tc.want) {
				t.Fatalf("got %q, %v; want %s error with %q", text, err, tc.code, tc.want)
			}
		})
	}
}

// An engine's usual head (vLLM's uvicorn, the simulator) is read with a
// few allocations: its common fields and values are not made anew, and
// the first values of all fields share one array.
func TestReadHeadAllocs(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 17:47:50 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\nx-request-id: 0f3a\r\n\r\n"
	r := strings.NewReader(head)
	br := bufio.NewReader(r)
	var resp *http.Response
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(head)
		br.Reset(r)
		var err error
		if resp, err = readHead(br); err != nil {
			t.Fatal(err)
		}
	})
	// The status line, the answer, its header map (two), the values'
	// array and the two values of this answer's own (date, request id).
	if allocs > 7 {
		t.Fatalf("reading a head: %.1f allocations, want at most 7", allocs)
	}
	want := http.Header{"Date": {"Sat, 05 Dec 2026 17:47:50 GMT"}, "Server": {"uvicorn"}, "Content-Type": {"text/event-stream; charset=utf-8"},
		"Transfer-Encoding": {"chunked"}, "X-Request-Id": {"0f3a"}}
	if resp.Status != "200 OK" || resp.StatusCode != 200 || !reflect.DeepEqual(resp.Header, want) {
		t.Fatalf("head %q %v, want 200 OK %v", resp.Status, resp.Header, want)
	}
}

// A field that repeats, more fields than the shared array holds, and a
// status with no reason or spaces before it read as net/http reads them.
func TestReadHeadFields(t *testing.T) {
	var b strings.Builder
	b.WriteString("HTTP/1.1 404   Not  Found\r\nSet-Cookie: a\r\nset-cookie: b\r\n")
	for i := range 12 {
		fmt.Fprintf(&b, "X-F%d: %d\r\n", i, i)
	}
	b.WriteString("X-F3: again\r\n\r\n")
	resp, err := readHead(bufio.NewReader(strings.NewReader(b.String())))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := http.ReadResponse(bufio.NewReader(strings.NewReader(b.String())), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(resp.Header, ref.Header) || resp.Status != "404 Not  Found" || resp.StatusCode != 404 {
		t.Fatalf("head %q %v, net/http %q %v", resp.Status, resp.Header, ref.Status, ref.Header)
	}
	resp, err = readHead(bufio.NewReader(strings.NewReader("HTTP/1.1 500\r\n\r\n")))
	if err != nil || resp.Status != "500" {
		t.Fatalf("a status without reason: %v %v", resp, err)
	}
}

// FuzzReadResponse: every answer readResponse takes, http.ReadResponse
// takes too, with the same status, header fields, body and reuse.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.0 404 Not Found\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\nrest",
		"HTTP/1.1 204 No Content\r\nX-A: a\n b\r\n\r\n",
		"HTTP/1.1 500\r\ncontent-length: 2\r\n\r\nok",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		resp, err := readResponse(bufio.NewReader(bytes.NewReader(in)))
		if err != nil {
			return
		}
		body, berr := io.ReadAll(resp.Body)
		// net/http's Transport skips interim answers as readResponse does.
		rbr := bufio.NewReader(bytes.NewReader(in))
		ref, err := http.ReadResponse(rbr, &http.Request{Method: http.MethodPost})
		for err == nil && ref.StatusCode < 200 && ref.StatusCode != http.StatusSwitchingProtocols {
			ref, err = http.ReadResponse(rbr, &http.Request{Method: http.MethodPost})
		}
		if err != nil {
			t.Fatalf("readResponse took an answer http.ReadResponse refuses (%v): %q", err, in)
		}
		refBody, refErr := io.ReadAll(ref.Body)
		if ref.StatusCode != resp.StatusCode || ref.Close != resp.Close || ref.ContentLength != resp.ContentLength {
			t.Fatalf("status %d close %v length %d, net/http %d %v %d: %q", resp.StatusCode, resp.Close, resp.ContentLength,
				ref.StatusCode, ref.Close, ref.ContentLength, in)
		}
		for k, v := range resp.Header {
			if rv := ref.Header[k]; strings.Join(rv, "\x00") != strings.Join(v, "\x00") {
				t.Fatalf("header %s: %q, net/http %q: %q", k, v, rv, in)
			}
		}
		// One leniency: a trailer section ended by a bare LF at the
		// connection's end, which net/http's trailer reader refuses.
		lenient := berr == nil && refErr != nil && strings.Contains(refErr.Error(), "trailer")
		if (berr == nil) != (refErr == nil) && !lenient || !bytes.Equal(body, refBody) {
			t.Fatalf("body %q (%v), net/http %q (%v): %q", body, berr, refBody, refErr, in)
		}
	})
}

func strconvInt(n int) string { return strconv.Itoa(n) }
func strconvHex(n int) string { return strconv.FormatInt(int64(n), 16) }
