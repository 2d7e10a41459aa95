package oaiformat

import (
	"bytes"
	"encoding/json"
	"errors"
	"runtime"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

// allocated returns the bytes fn allocates.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// longArray returns a request whose member name holds n copies of elem.
func longArray(prefix, name, elem string, n int) []byte {
	var b bytes.Buffer
	b.WriteString(prefix + `"` + name + `":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// TestReadLongArraysBounded: an array past its cap is refused after
// reading the cap's worth of it, not after decoding all of it: a body of a
// million empty messages (or stop strings) costs a bounded allocation,
// far less than one per element.
func TestReadLongArraysBounded(t *testing.T) {
	const n = 1_000_000
	for _, tc := range []struct {
		name, body string
		param      string
	}{
		{"messages", string(longArray(`{`, "messages", `{}`, n)), "messages"},
		{"messages then more", string(longArray(`{`, "messages", `{"role":"user"}`, MaxMessages+1)), "messages"},
		{"stop", string(longArray(`{"messages":[{"role":"user","content":"x"}],`, "stop", `""`, n)), "stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			var err error
			alloc := allocated(func() { _, err = Read(wire.API_API_CHAT, body) })
			var e *Error
			if !errors.As(err, &e) || e.Param != tc.param || e.Code != "invalid_value" {
				t.Fatalf("Read: %v, want an invalid_value of %s", err, tc.param)
			}
			// The body's own copy (json.RawMessage of the whole value) and
			// the bound's elements; a decode of every element costs tens
			// of bytes per element on top.
			if limit := uint64(10*len(body)) + 8<<20; alloc > limit {
				t.Errorf("Read allocated %d bytes for a %d-byte body, want at most %d", alloc, len(body), limit)
			}
		})
	}
	// At the cap it is still read, and every element checked.
	if _, err := Read(wire.API_API_CHAT, longArray(`{`, "messages", `{"role":"user"}`, MaxMessages)); err != nil {
		t.Fatalf("%d messages: %v", MaxMessages, err)
	}
}

func TestElements(t *testing.T) {
	var got []string
	err := Elements([]byte(` [1, "a" ,{"b":[2]}, null] `), 4, func(i int, e json.RawMessage) error {
		got = append(got, string(e))
		return nil
	})
	if err != nil || len(got) != 4 || got[2] != `{"b":[2]}` {
		t.Fatalf("Elements: %q, %v", got, err)
	}
	if err := Elements([]byte(`[1,2,3]`), 2, func(int, json.RawMessage) error { return nil }); !errors.Is(err, ErrTooManyElements) {
		t.Fatalf("Elements past its bound: %v", err)
	}
}
