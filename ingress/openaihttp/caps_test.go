package openaihttp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
)

// TestLongArraysRefusedCheaply: a body of a million tiny array elements,
// in messages or in an embeddings input, is refused over HTTP with a 400
// naming the member, having cost the broker its body and a bounded
// decoding, not an allocation per element.
func TestLongArraysRefusedCheaply(t *testing.T) {
	srv := httptest.NewServer(New(nil, Config{}))
	defer srv.Close()
	long := func(prefix, elem string) []byte {
		var b bytes.Buffer
		b.WriteString(prefix)
		for i := range 1_000_000 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(elem)
		}
		b.WriteString("]}")
		return b.Bytes()
	}
	for _, tc := range []struct {
		name, path string
		body       []byte
		param      string
	}{
		{"messages", "/v1/chat/completions", long(`{"model":"m","messages":[`, `{}`), "messages"},
		{"embeddings input", "/v1/embeddings", long(`{"model":"m","input":[`, `1`), "input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			resp, err := http.Post(srv.URL+tc.path, "application/json", bytes.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			runtime.ReadMemStats(&after)
			var e struct {
				Error struct {
					Param *string `json:"param"`
				} `json:"error"`
			}
			if err := json.Unmarshal(data, &e); err != nil || resp.StatusCode != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != tc.param {
				t.Fatalf("%d %s, want a 400 naming %s", resp.StatusCode, data, tc.param)
			}
			// Client and server share the process: the body's copies on
			// both sides and a bounded decoding, where one per element
			// costs a gigabyte.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 20*uint64(len(tc.body))+(16<<20) {
				t.Fatalf("the request allocated %d MiB for a %d-byte body", alloc>>20, len(tc.body))
			}
		})
	}
}
