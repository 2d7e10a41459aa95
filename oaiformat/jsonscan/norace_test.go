//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package jsonscan

import (
	"testing"
)

func TestScanAllocs(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		limit float64
	}{
		{chatChunk, 1},
		{benchChunk, 1},
		{`{"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}`, 0},
		{typical[9].raw, 0}, // usage only
		{`{"choices":[{"delta":{"content":"caf\u00e9"},"text":"x"}]}`, 1},
	} {
		raw := []byte(tc.raw)
		var f Fields
		allocs := testing.AllocsPerRun(100, func() {
			if err := Scan(raw, &f); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > tc.limit {
			t.Errorf("Scan(%q): %v allocations, want at most %v", raw, allocs, tc.limit)
		}
	}
}

// TestScanSpan: a plain text is reported as its span of the chunk and
// makes no allocation; an escaped, non-ASCII-invalid or two-part text is a
// string as Scan makes it.
func TestScanSpan(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		span string // the text as a span, or "" for none
		text string // the text as a string
	}{
		{chatChunk, " hi", ""},
		{benchChunk, " hi", ""},
		{`{"choices":[{"text":"caf\u00e9"}]}`, "", "café"},
		{`{"choices":[{"text":"café"}]}`, "café", ""},
		{`{"choices":[{"delta":{"content":"a\nb"}}]}`, "", "a\nb"},
		{`{"choices":[{"delta":{"content":"a"},"text":"b"}]}`, "", "ab"},
		{`{"choices":[{"delta":{"content":""},"text":"b"}]}`, "b", ""},
		{`{"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}`, "", ""},
		{"{\"choices\":[{\"text\":\"\xff\"}]}", "", "\ufffd"},
	} {
		raw := []byte(tc.raw)
		var f Fields
		if err := ScanSpan(raw, &f); err != nil {
			t.Fatalf("ScanSpan(%q): %v", raw, err)
		}
		if got := string(raw[f.TextStart:f.TextEnd]); got != tc.span || f.Text != tc.text {
			t.Errorf("ScanSpan(%q): span %q, text %q; want %q, %q", raw, got, f.Text, tc.span, tc.text)
		}
		checkParity(t, raw)
		if tc.span == "" {
			continue
		}
		if allocs := testing.AllocsPerRun(100, func() { _ = ScanSpan(raw, &f) }); allocs != 0 {
			t.Errorf("ScanSpan(%q): %v allocations, want 0", raw, allocs)
		}
	}
}
