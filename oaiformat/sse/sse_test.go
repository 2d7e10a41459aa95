package sse_test

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/switchyard-ai/switchyard/oaiformat/sse"
)

// ev is an event as a test compares it.
type ev struct {
	typ, data string
	comment   bool
}

// readAll reads body through a Reader with bound max, comments shown if
// comments, and returns the events, the event the body ended inside (if
// any), and the error that ended it (nil at io.EOF).
func readAll(r io.Reader, max int, comments bool) (events []ev, cut *ev, err error) {
	rd := sse.NewReader(r, max)
	if comments {
		rd.ShowComments()
	}
	for {
		e, err := rd.Next()
		switch {
		case err == nil:
			events = append(events, ev{string(e.Type), string(e.Data), e.Comment})
		case errors.Is(err, io.EOF):
			return events, nil, nil
		case errors.Is(err, io.ErrUnexpectedEOF):
			return events, &ev{typ: string(e.Type), data: string(e.Data)}, nil
		default:
			return events, nil, err
		}
	}
}

func TestReader(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string
		comments bool
		want     []ev
		cut      *ev
		err      error
	}{
		{name: "events", body: "data: one\n\ndata:two\n\n", want: []ev{{data: "one"}, {data: "two"}}},
		{name: "CRLF", body: "data: one\r\n\r\ndata: two\r\n\r\n", want: []ev{{data: "one"}, {data: "two"}}},
		{name: "lines joined", body: "data: multi\ndata: line\n\n", want: []ev{{data: "multi\nline"}}},
		{name: "one space dropped", body: "data:  two spaces\n\n", want: []ev{{data: " two spaces"}}},
		{name: "typed", body: "event: error\ndata: {}\n\ndata: plain\n\n", want: []ev{{typ: "error", data: "{}"}, {data: "plain"}}},
		{name: "type without data not dispatched", body: "event: ping\n\ndata: x\n\n", want: []ev{{data: "x"}}},
		{name: "other fields", body: "id: 7\nretry: 10\nfoo: bar\ndata: x\n\n", want: []ev{{data: "x"}}},
		{name: "empty data is an event", body: "data:\n\n", want: []ev{{data: ""}}},
		{name: "field without colon", body: "data\ndata: x\n\n", want: []ev{{data: "\nx"}}},
		{name: "comments hidden", body: ": keep-alive\ndata: x\n\n", want: []ev{{data: "x"}}},
		{name: "comments shown", body: ": keep-alive\ndata: x\n: mid-event\ndata: y\n\n", comments: true,
			want: []ev{{data: "keep-alive", comment: true}, {data: "mid-event", comment: true}, {data: "x\ny"}}},
		{name: "cut inside an event", body: "data: x\n\ndata: [DONE]", want: []ev{{data: "x"}}, cut: &ev{data: "[DONE]"}},
		{name: "cut after a data line", body: "data: [DONE]\n", cut: &ev{data: "[DONE]"}},
		{name: "cut inside a type", body: "data: x\n\nevent: e", want: []ev{{data: "x"}}},
		{name: "line at the bound", body: "data: " + strings.Repeat("x", 58) + "\n\n", want: []ev{{data: strings.Repeat("x", 58)}}},
		{name: "line past the bound", body: "data: ok\n\ndata: " + strings.Repeat("x", 59) + "\n\n", want: []ev{{data: "ok"}}, err: sse.ErrLineTooLong},
		{name: "event past the bound", body: strings.Repeat("data: "+strings.Repeat("x", 20)+"\n", 4) + "\n", err: sse.ErrEventTooLarge},
		{name: "event at the bound", body: strings.Repeat("data: "+strings.Repeat("x", 15)+"\n", 4) + "\n", want: []ev{{data: strings.Repeat(strings.Repeat("x", 15)+"\n", 3) + strings.Repeat("x", 15)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, oneByte := range []bool{false, true} {
				var r io.Reader = strings.NewReader(tc.body)
				if oneByte {
					r = iotest.OneByteReader(r)
				}
				events, cut, err := readAll(r, 64, tc.comments)
				if !slices.Equal(events, tc.want) || !errors.Is(err, tc.err) || (cut == nil) != (tc.cut == nil) || (cut != nil && *cut != *tc.cut) {
					t.Fatalf("one byte at a time %v: %+v, cut %v, %v; want %+v, cut %v, %v", oneByte, events, cut, err, tc.want, tc.cut, tc.err)
				}
			}
		})
	}
}

// A read error other than the end is returned as it is.
func TestReaderError(t *testing.T) {
	boom := errors.New("boom")
	_, _, err := readAll(io.MultiReader(strings.NewReader("data: x\n"), iotest.ErrReader(boom)), 64, false)
	if !errors.Is(err, boom) {
		t.Fatalf("%v, want boom", err)
	}
}

// EventAhead is true exactly when the rest of another event is already
// read.
func TestEventAhead(t *testing.T) {
	pr, pw := io.Pipe()
	r := sse.NewReader(pr, 1<<10)
	go func() {
		_, _ = pw.Write([]byte("data: a\n\ndata: b\n\ndata: c"))
		_, _ = pw.Write([]byte("\n\n"))
		_ = pw.Close()
	}()
	for _, want := range []struct {
		data  string
		ahead bool
	}{{"a", true}, {"b", false}} {
		e, err := r.Next()
		if err != nil || string(e.Data) != want.data || r.EventAhead() != want.ahead {
			t.Fatalf("%q %v ahead %v, want %q ahead %v", e.Data, err, r.EventAhead(), want.data, want.ahead)
		}
	}
}

// Reset reads a new stream with its own bound, and keeps no buffer grown
// past a long event.
func TestReset(t *testing.T) {
	r := sse.NewReader(strings.NewReader("data: "+strings.Repeat("x", 100<<10)+"\n\n"), 1<<20)
	if e, err := r.Next(); err != nil || len(e.Data) != 100<<10 {
		t.Fatalf("%d bytes, %v", len(e.Data), err)
	}
	r.Reset(strings.NewReader("data: "+strings.Repeat("x", 20)+"\n\n"), 10)
	if _, err := r.Next(); !errors.Is(err, sse.ErrLineTooLong) {
		t.Fatalf("%v, want the new bound", err)
	}
	r.Reset(strings.NewReader("data: y\n\n"), 10)
	if e, err := r.Next(); err != nil || string(e.Data) != "y" {
		t.Fatalf("%q %v", e.Data, err)
	}
}

// FuzzReader: however the stream is cut into reads, the same events come
// out, none past the bound; and they are the events of the reference
// reader below, the line-by-line reader the load generator had before.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		": comment\r\ndata: one\r\n\r\ndata:two\n\ndata: multi\ndata: line\n\n",
		"event: error\ndata: {\"message\":\"m\"}\n\nevent: ping\n\ndata: last without blank line",
		"data: a\n\ndata: b\n\ndata: [DONE]\n\n",
		"data: x\n\ndata: {\"error\":{\"message\":\"boom\",\"code\":400}}\n\ndata: y\n\n",
		"\n\n\ndata: \n\ndata:  two spaces\n\ndata: [DONE]\n\nafter",
		"data\nid: 1\nretry: 5\n\n",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		const max = 64
		whole, wcut, werr := readAll(bytes.NewReader(body), max, false)
		parts, pcut, perr := readAll(iotest.HalfReader(&cutReader{b: body, n: 1 + int(cut)}), max, false)
		if !slices.Equal(whole, parts) || (wcut == nil) != (pcut == nil) || (wcut != nil && *wcut != *pcut) || !errors.Is(perr, werr) {
			t.Fatalf("whole: %+v %v %v; in reads of %d: %+v %v %v", whole, wcut, werr, 1+int(cut), parts, pcut, perr)
		}
		for _, e := range whole {
			if len(e.data) > max {
				t.Fatalf("an event of %d bytes", len(e.data))
			}
		}
		if werr != nil {
			return // the reference has no bound
		}
		if wcut != nil {
			whole = append(whole, *wcut)
		}
		for i := range whole {
			if whole[i].typ != "error" {
				whole[i].typ = ""
			}
		}
		if ref := reference(body); !slices.Equal(whole, ref) {
			t.Fatalf("events %+v, the reference's %+v", whole, ref)
		}
	})
}

// cutReader reads b at most n bytes at a time.
type cutReader struct {
	b []byte
	n int
}

func (r *cutReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[n:]
	return n, nil
}

// reference is the load generator's SSE reader before oaiformat/sse, on
// a whole body: the events of body, with one the body ended inside last.
// It types an event only as "error" or not, as that reader did.
func reference(body []byte) []ev {
	var out []ev
	var data []byte
	hasData, errType := false, false
	lines := bytes.Split(body, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1] // the body ended with its last line's \n
	}
	dispatch := func() {
		typ := ""
		if errType {
			typ = "error"
		}
		out = append(out, ev{typ: typ, data: string(data)})
	}
	for _, line := range lines {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			if hasData {
				dispatch()
			}
			data, hasData, errType = data[:0], false, false
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "event":
			errType = string(value) == "error"
		}
	}
	if hasData {
		dispatch()
	}
	return out
}
