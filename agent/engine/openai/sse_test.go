package openai

import (
	"errors"
	"io"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

type emitted struct {
	data string
	more bool
}

// TestReadSSEMore: more is true exactly when the next whole event was read
// with this one, so a burst can travel as one message and a lone event (or
// one whose successor is still partial) goes out at once.
func TestReadSSEMore(t *testing.T) {
	pr, pw := io.Pipe()
	got := make(chan emitted, 16)
	done := make(chan error, 1)
	go func() {
		done <- ReadSSE(pr, func(b []byte, more bool) error {
			got <- emitted{string(b), more}
			return nil
		})
	}()
	next := func() emitted {
		t.Helper()
		return <-got
	}
	write := func(s string) {
		t.Helper()
		if _, err := pw.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// A burst of three in one write: the first two know a successor is here.
	write("data: a\n\ndata: b\n\ndata: c\n\n")
	for _, want := range []emitted{{"a", true}, {"b", true}, {"c", false}} {
		if e := next(); e != want {
			t.Fatalf("got %+v, want %+v", e, want)
		}
	}
	// An event followed by half of the next: the engine may be slow to
	// finish it, so the first must not wait.
	write("data: d\n\ndata: e")
	if e := next(); e != (emitted{"d", false}) {
		t.Fatalf("got %+v, want d without more", e)
	}
	write("\n\n")
	if e := next(); e != (emitted{"e", false}) {
		t.Fatalf("got %+v, want e without more", e)
	}
	// CRLF framing counts too; [DONE] ends the stream without an emit.
	write("data: f\r\n\r\ndata: [DONE]\r\n\r\n")
	if e := next(); e != (emitted{"f", true}) {
		t.Fatalf("got %+v, want f with more", e)
	}
	if err := <-done; err != nil {
		t.Fatalf("ReadSSE: %v", err)
	}
	_ = pw.Close()
}

// TestReadSSEEnds: an error event and a cut stream are engine errors.
func TestReadSSEEnds(t *testing.T) {
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("data: {\"x\":1}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n"))
	}()
	n := 0
	err := ReadSSE(pr, func([]byte, bool) error { n++; return nil })
	if !errors.Is(err, &wire.Error{Code: wire.CodeEngine}) || n != 1 {
		t.Fatalf("err %v after %d events, want an engine error after 1", err, n)
	}
	pr2, pw2 := io.Pipe()
	go func() {
		_, _ = pw2.Write([]byte("data: {\"x\":1}\n\n"))
		_ = pw2.Close()
	}()
	if err := ReadSSE(pr2, func([]byte, bool) error { return nil }); !errors.Is(err, &wire.Error{Code: wire.CodeEngine}) {
		t.Fatalf("cut stream: %v, want an engine error", err)
	}
}
