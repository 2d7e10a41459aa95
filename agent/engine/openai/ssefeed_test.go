package openai

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/wire"
)

// refReadSSE is ReadSSE as it was before the feed: a line reader pulling
// through a bufio.Reader. It is the reference the feed is held to, with
// one fix: a body that ends right after "data: [DONE]\n" ended well (the
// old reader took it as cut, where "data: [DONE]" without the newline was
// not).
func refReadSSE(body io.Reader, emit func([]byte) error) error {
	br := bufio.NewReaderSize(body, 64<<10)
	var data []byte
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			full := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				full = append(full, line...)
			}
			line = full
		}
		if len(line) == 0 && err != nil {
			if errors.Is(err, io.EOF) && bytes.Equal(data, []byte("[DONE]")) {
				return nil // the fix
			}
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if len(data) > 0 {
				if bytes.Equal(data, []byte("[DONE]")) {
					return nil
				}
				if e := eventError(data); e != nil {
					return e
				}
				if err := emit(data); err != nil {
					return err
				}
				data = data[:0]
			}
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[5:], []byte(" "))
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, v...)
		}
		if err != nil {
			if errors.Is(err, io.EOF) && bytes.Equal(data, []byte("[DONE]")) {
				return nil
			}
			return err
		}
	}
}

// outcome is what a reader of an answer made of it: the events emitted,
// whether it ended well, and an error event's message.
type outcome struct {
	events   []string
	ok       bool
	eventErr string
}

func (o outcome) String() string {
	return fmt.Sprintf("%d events %q, ok %v, error event %q", len(o.events), o.events, o.ok, o.eventErr)
}

func outcomeOf(events []string, err error) outcome {
	return outcome{events: events, ok: err == nil, eventErr: eventErrorMessage(err)}
}

// eventErrorMessage is the message of an error event, as eventError reads
// it, or "".
func eventErrorMessage(err error) string {
	var we *wire.Error
	if errors.As(err, &we) && !strings.HasPrefix(we.Message, "reading engine stream") && !strings.HasPrefix(we.Message, "engine closed") {
		return we.Code + ": " + we.Message
	}
	return ""
}

// reference reads a wire body with net/http's chunked reader (and the
// trailer reading of chunkedBody) or as it is, then refReadSSE.
func reference(body []byte, fr framing) outcome {
	var r io.Reader = bytes.NewReader(body)
	if fr == framedByChunks {
		br := bufio.NewReader(r)
		r = &chunkedBody{br: br, cr: httputil.NewChunkedReader(br)}
	}
	var events []string
	err := refReadSSE(r, func(d []byte) error { events = append(events, string(d)); return nil })
	return outcomeOf(events, err)
}

// fed pushes body to a feed in the pieces cuts makes of it, then its end.
func fed(body []byte, fr framing, cuts []int) outcome {
	f := newFeed(fr, int64(len(body)))
	var events []string
	emit := func(d []byte, _ bool) error { events = append(events, string(d)); return nil }
	p := slices.Clone(body) // push may overwrite what it is given
	for _, c := range append(cuts, len(p)) {
		c = min(c, len(p))
		if done, err := f.push(p[:c], emit); done {
			return outcomeOf(events, err)
		}
		p = p[c:]
	}
	return outcomeOf(events, f.eof(emit))
}

// chunkEncode frames body as chunks of the sizes r picks, with extensions
// and a trailer now and then.
func chunkEncode(body []byte, r *rand.Rand) []byte {
	var b []byte
	for len(body) > 0 {
		n := min(1+r.IntN(40), len(body))
		b = strconv.AppendUint(b, uint64(n), 16)
		if r.IntN(8) == 0 {
			b = append(b, ";ext=1"...)
		}
		b = append(b, "\r\n"...)
		b = append(b, body[:n]...)
		b = append(b, "\r\n"...)
		body = body[n:]
	}
	b = append(b, "0\r\n"...)
	if r.IntN(4) == 0 {
		b = append(b, "X-Trailer: 1\r\n"...)
	}
	return append(b, "\r\n"...)
}

func cutsOf(n int, r *rand.Rand) []int {
	var cuts []int
	for left := n; left > 0; {
		c := 1 + r.IntN(min(left, 64))
		cuts = append(cuts, c)
		left -= c
	}
	return cuts
}

var feedSeeds = []string{
	"data: a\n\ndata: b\n\ndata: [DONE]\n\n",
	"data: {\"choices\":[]}\r\n\r\ndata: [DONE]\r\n\r\n",
	": comment\nevent: x\nid: 1\ndata: one\ndata:two\n\ndata: [DONE]",
	"data: x\n\ndata: {\"error\":{\"message\":\"boom\",\"code\":400}}\n\ndata: y\n\n",
	"data: x\n\n",
	"data: x\n\ndata: [DO",
	"\n\n\ndata: \n\ndata:  two spaces\n\ndata: [DONE]\n\nafter",
	"data: " + strings.Repeat("long ", 3000) + "\n\ndata: [DONE]\n\n",
}

// TestFeedMatchesReference: pushed in any pieces, framed by chunks, by
// its length or by the connection's end, an answer gives the events and
// the end the pulling reader gave.
func TestFeedMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i, body := range feedSeeds {
		for range 20 {
			wireBody := chunkEncode([]byte(body), r)
			cuts := cutsOf(len(wireBody), r)
			if got, want := fed(wireBody, framedByChunks, cuts), reference(wireBody, framedByChunks); !equalOutcome(got, want) {
				t.Fatalf("seed %d chunked, cuts %v:\nfeed      %v\nreference %v", i, cuts, got, want)
			}
			cuts = cutsOf(len(body), r)
			for _, fr := range []framing{framedByClose, framedByLength} {
				if got, want := fed([]byte(body), fr, cuts), reference([]byte(body), framedByClose); !equalOutcome(got, want) {
					t.Fatalf("seed %d framing %d, cuts %v:\nfeed      %v\nreference %v", i, fr, cuts, got, want)
				}
			}
		}
	}
}

func equalOutcome(a, b outcome) bool {
	return slices.Equal(a.events, b.events) && a.ok == b.ok && a.eventErr == b.eventErr
}

// TestFeedChunkedErrors: the chunk framing net/http refuses is refused,
// after the events that came before it.
func TestFeedChunkedErrors(t *testing.T) {
	ev := "data: a\n\n"
	chunk := fmt.Sprintf("%x\r\n%s\r\n", len(ev), ev)
	for _, tc := range []struct{ name, wire string }{
		{"bare LF after a size", chunk + "9\ndata: b\n\n\r\n0\r\n\r\n"},
		{"no CRLF after the data", fmt.Sprintf("%x\r\n%sxx", len(ev), ev)},
		{"not hex", chunk + "zz\r\n"},
		{"17 hex digits", chunk + "10000000000000000\r\n"},
		{"a long size line", chunk + "1;" + strings.Repeat("e", maxChunkLine) + "\r\nx\r\n"},
		{"space before an extension", chunk + "9 ;x\r\ndata: b\n\n\r\n0\r\n\r\n"},
		{"a folded first trailer", chunk + "0\r\n x\r\n\r\n"},
		{"extensions outweigh data", chunk + strings.Repeat("1;"+strings.Repeat("e", 1000)+"\r\n:\r\n", 40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := reference([]byte(tc.wire), framedByChunks)
			if want.ok {
				t.Fatalf("the reference took it: %v", want)
			}
			for _, cuts := range [][]int{nil, cutsOf(len(tc.wire), rand.New(rand.NewPCG(3, 4)))} {
				if got := fed([]byte(tc.wire), framedByChunks, cuts); !equalOutcome(got, want) {
					t.Fatalf("cuts %v:\nfeed      %v\nreference %v", cuts, got, want)
				}
			}
			if got := fed([]byte(tc.wire), framedByChunks, nil); len(got.events) != 1 || got.events[0] != "a" {
				t.Fatalf("the event before the bad framing: %v", got)
			}
		})
	}
}

// TestFeedMore: more is true exactly when the next whole event arrived in
// the same push, through the chunk framing too.
func TestFeedMore(t *testing.T) {
	type ev struct {
		data string
		more bool
	}
	var got []ev
	emit := func(d []byte, more bool) error { got = append(got, ev{string(d), more}); return nil }
	f := newFeed(framedByChunks, -1)
	push := func(s string) {
		t.Helper()
		if done, err := f.push([]byte(s), emit); done || err != nil {
			t.Fatalf("push %q: done %v, %v", s, done, err)
		}
	}
	push("1b\r\ndata: a\n\ndata: b\n\ndata: c\n\n\r\n")
	push("10\r\ndata: d\n\ndata: e")
	push("\r\n2\r\n\n\n\r\n")
	want := []ev{{"a", true}, {"b", true}, {"c", false}, {"d", false}, {"e", false}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// The body's end after [DONE] is read in the same push.
	done, err := f.push([]byte("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"), emit)
	if !done || err != nil || !f.bodyDone {
		t.Fatalf("[DONE] and the last chunk: done %v, %v, body done %v", done, err, f.bodyDone)
	}
}

// FuzzFeed: whatever the bytes and however they are cut, the feed agrees
// with net/http's chunked reader and the pulling parser.
func FuzzFeed(f *testing.F) {
	for i, s := range feedSeeds {
		f.Add([]byte(s), uint64(i), false)
		f.Add(chunkEncode([]byte(s), rand.New(rand.NewPCG(uint64(i), 0))), uint64(i), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, seed uint64, raw bool) {
		r := rand.New(rand.NewPCG(seed, seed>>7))
		wireBody := body
		if !raw {
			wireBody = chunkEncode(body, r)
		}
		cuts := cutsOf(len(wireBody), r)
		if got, want := fed(wireBody, framedByChunks, cuts), reference(wireBody, framedByChunks); !equalOutcome(got, want) {
			t.Fatalf("chunked %q, cuts %v:\nfeed      %v\nreference %v", wireBody, cuts, got, want)
		}
		if got, want := fed(body, framedByClose, cutsOf(len(body), r)), reference(body, framedByClose); !equalOutcome(got, want) {
			t.Fatalf("unframed %q:\nfeed      %v\nreference %v", body, got, want)
		}
	})
}

// TestStreamLateBodyEnd: an engine that sends the chunked body's end a
// moment after [DONE] still gets its connection reused; one that never
// sends it loses the connection, not the stream.
func TestStreamLateBodyEnd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		conns int
	}{
		{"body end 10ms after [DONE]", 10 * time.Millisecond, 1},
		{"body end after the drain wait", 4 * drainWait, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var accepted atomic.Int32
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					accepted.Add(1)
					go func() {
						defer c.Close()
						br := bufio.NewReader(c)
						for {
							req, err := http.ReadRequest(br)
							if err != nil {
								return
							}
							_, _ = io.Copy(io.Discard, req.Body)
							ev := "data: {\"x\":1}\n\ndata: [DONE]\n\n"
							fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
							time.Sleep(tc.delay)
							if _, err := io.WriteString(c, "0\r\n\r\n"); err != nil {
								return
							}
						}
					}()
				}
			}()
			a, err := New("http://"+ln.Addr().String(), 4)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				text, err := streamText(context.Background(), a)
				if err != nil || text != "{\"x\":1}\n" {
					t.Fatalf("request %d: %q, %v", i, text, err)
				}
			}
			if n := int(accepted.Load()); n != tc.conns {
				t.Fatalf("2 requests on %d connections, want %d", n, tc.conns)
			}
		})
	}
}
