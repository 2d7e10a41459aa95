package openaihttp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadAll: the body as io.ReadAll reads it, whatever the declared
// length says, and the reader's error.
func TestReadAll(t *testing.T) {
	body := strings.Repeat("x", 1000)
	for _, tc := range []struct {
		name     string
		declared int64
	}{
		{"declared", 1000},
		{"none", -1},
		{"declared short", 10},
		{"declared long", 5000},
		{"over the bound", 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(iotest.HalfReader(strings.NewReader(body)), tc.declared, 1<<20)
			if err != nil || string(got) != body {
				t.Fatalf("read %d bytes, %v; want the %d-byte body", len(got), err, len(body))
			}
		})
	}
	boom := errors.New("boom")
	got, err := readAll(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 100, 1<<20)
	if !errors.Is(err, boom) || !bytes.Equal(got, []byte("abc")) {
		t.Fatalf("read %q, %v; want abc and the reader's error", got, err)
	}
}
