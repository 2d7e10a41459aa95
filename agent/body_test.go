package agent

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestStreamingBody(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"adds both", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`},
		{"replaces the client's", `{"stream":false,"model":"m","stream_options":{"include_usage":false,"continuous_usage_stats":true}}`,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{"empty object", ` { } `, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{"keeps values as written", "{\"prompt\" : \"a\\u00e9\\n\" ,\n \"max_tokens\":  16}",
			"{\"prompt\" : \"a\\u00e9\\n\",\"max_tokens\":  16,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"},
		{"duplicates of stream all go", `{"stream":false,"stream":false,"n":1}`,
			`{"n":1,"stream":true,"stream_options":{"include_usage":true}}`},
		// An escaped key may spell "stream": decoded keys decide.
		{"escaped key", `{"str\u0065am":false,"model":"m"}`,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := streamingBody([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("streamingBody(%s)\n got %s\nwant %s", tc.in, got, tc.want)
			}
		})
	}
	for _, bad := range []string{``, `null`, `[]`, `"s"`, `{"a":1`, `{"a":1} x`, `{"a":}`, `{"a":1,}`, `{'a':1}`} {
		if got, err := streamingBody([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "job body: ") {
			t.Errorf("streamingBody(%q) = %s, %v; want a job body error", bad, got, err)
		}
	}
}

// FuzzStreamingBody holds the one-pass rewrite to the encoding/json one: it
// fails exactly when that does, and what it sends decodes to the same
// request.
func FuzzStreamingBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false}`,
		`{"prompt":"x","stream_options":{"include_usage":false},"max_tokens":3}`,
		`{"a":{"stream":1},"b":[1,2,{"c":null}],"d":"\u0000\ud800"}`,
		`{"str\u0065am":1}`, `{"é":1,"stream":true}`, `{}`, `null`, `{"a":1`, `{"a":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := streamingBody(body)
		want, werr := streamingBodyDecoded(body)
		if (err != nil) != (werr != nil) {
			t.Fatalf("body %q: error %v, encoding/json's %v", body, err, werr)
		}
		if err != nil {
			return
		}
		var g, w map[string]any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("body %q: output %q does not decode: %v", body, got, err)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("body %q:\n got %s\nwant %s", body, got, want)
		}
	})
}

// BenchmarkStreamingBody compares the one-pass rewrite with encoding/json's
// decode and encode on a typical chat request.
func BenchmarkStreamingBody(b *testing.B) {
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},` +
		`{"role":"user","content":"` + strings.Repeat("Tell me about the history of rail yards. ", 12) + `"}],` +
		`"max_tokens":256,"temperature":0.7,"top_p":0.95,"stream":true,"stream_options":{"include_usage":true}}`)
	for _, bc := range []struct {
		name string
		fn   func([]byte) ([]byte, error)
	}{{"one-pass", streamingBody}, {"encoding-json", streamingBodyDecoded}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.fn(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
