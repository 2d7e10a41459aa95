package oaiformat

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const su = `"stream":true,"stream_options":{"include_usage":true}`

func TestStreamingBody(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"adds both", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],` + su + `}`},
		{"merges stream_options", `{"stream":false,"model":"m","stream_options":{"include_usage":false,"continuous_usage_stats":true}}`,
			`{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`},
		{"null stream_options", `{"stream_options":null}`, `{` + su + `}`},
		{"empty object", ` { } `, `{` + su + `}`},
		{"keeps values as written", "{\"prompt\" : \"a\\u00e9\\n\" ,\n \"max_tokens\":  16}",
			"{\"prompt\" : \"a\\u00e9\\n\",\"max_tokens\":  16," + su + "}"},
		{"duplicates of stream all go", `{"stream":false,"stream":false,"n":1}`, `{"n":1,` + su + `}`},
		{"hand-off fields never pass", `{"kv_transfer_params":{"do_remote_prefill":true},"bootstrap_room":1,"n":1}`, `{"n":1,` + su + `}`},
		// An escaped key may spell "stream": decoded keys decide.
		{"escaped key", `{"str\u0065am":false,"model":"m"}`, `{"model":"m",` + su + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StreamingBody([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("StreamingBody(%s)\n got %s\nwant %s", tc.in, got, tc.want)
			}
		})
	}
	for _, bad := range []string{``, `null`, `[]`, `"s"`, `{"a":1`, `{"a":1} x`, `{"a":}`, `{"a":1,}`, `{'a':1}`, `{"stream_options":{"a":}}`} {
		if got, err := StreamingBody([]byte(bad)); !errors.Is(err, ErrNotObject) {
			t.Errorf("StreamingBody(%q) = %s, %v; want ErrNotObject", bad, got, err)
		}
	}
}

func TestLegBodies(t *testing.T) {
	const in = `{"model":"m","prompt":"p","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":50,"min_tokens":5,"min_completion_tokens":5,"temperature":0}`
	for _, tc := range []struct {
		name string
		fn   func([]byte) ([]byte, error)
		in   string
		want string
	}{
		{"vllm prefill", VLLMPrefillBody, in,
			`{"model":"m","prompt":"p","temperature":0,"kv_transfer_params":` + string(VLLMPrefillParams) + `,"stream":false,"max_tokens":1}`},
		{"vllm prefill max_completion_tokens", VLLMPrefillBody, `{"messages":[],"max_completion_tokens":9}`,
			`{"messages":[],"kv_transfer_params":` + string(VLLMPrefillParams) + `,"stream":false,"max_tokens":1,"max_completion_tokens":1}`},
		{"vllm decode", func(b []byte) ([]byte, error) { return VLLMDecodeBody(b, []byte(`{"remote_engine_id":"e"}`)) }, in,
			`{"model":"m","prompt":"p","max_tokens":50,"min_tokens":5,"min_completion_tokens":5,"temperature":0,"stream":true,"kv_transfer_params":{"remote_engine_id":"e"},"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`},
		{"sglang", func(b []byte) ([]byte, error) { return SGLangBody(b, "10.0.0.1", 8998, 1<<62+1) }, `{"prompt":"p","bootstrap_room":3}`,
			`{"prompt":"p","stream":true,"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":4611686018427387905,"stream_options":{"include_usage":true}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fn([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// sameJSON fails unless a and b decode to the same value.
func sameJSON(t *testing.T, in, a, b []byte) {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("input %q: output %q does not decode: %v", in, a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(x, y) {
		t.Fatalf("input %q:\n got %s\nwant %s", in, a, b)
	}
}

var edits = []struct {
	name string
	e    *Edit
}{
	{"streaming", &streaming},
	{"vllm prefill", &vllmPrefill},
	{"set and drop", &Edit{Drop: []string{"a", "é"}, Set: []Member{{"b", []byte(`[1]`)}}, SetIfPresent: []Member{{"c", []byte(`2`)}}}},
}

// FuzzRewrite holds the one-pass rewrite to the encoding/json one: it
// fails exactly when that does, and what it sends decodes to the same
// request.
func FuzzRewrite(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false}`,
		`{"prompt":"x","stream_options":{"include_usage":false,"continuous_usage_stats":true},"max_tokens":3,"min_tokens":2}`,
		`{"a":{"stream":1},"b":[1,2,{"c":null}],"d":"\u0000\ud800","c":1,"max_completion_tokens":4}`,
		`{"stream_options":{"incl\u0075de_usage":false,"x":1}}`, `{"stream_options":[1]}`,
		`{"str\u0065am":1}`, `{"é":1,"stream":true}`, `{}`, `null`, `{"a":1`, `{"a":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ed := range edits {
			got, err := Rewrite(body, ed.e)
			want, werr := rewriteDecoded(body, ed.e)
			if (err != nil) != (werr != nil) {
				t.Fatalf("%s: body %q: error %v, encoding/json's %v", ed.name, body, err, werr)
			}
			if err == nil {
				sameJSON(t, body, got, want)
			}
		}
	})
}

var benchBody = `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},` +
	`{"role":"user","content":"` + strings.Repeat("Tell me about the history of rail yards. ", 12) + `"}],` +
	`"max_tokens":256,"temperature":0.7,"top_p":0.95,"stream":true,"stream_options":{"include_usage":true}}`

// BenchmarkStreamingBody compares the member-copying rewrite with encoding/json's
// decode and encode on a typical chat request.
func BenchmarkStreamingBody(b *testing.B) {
	body := []byte(benchBody)
	for _, bc := range []struct {
		name string
		fn   func([]byte) ([]byte, error)
	}{
		{"members", StreamingBody},
		{"encoding-json", func(b []byte) ([]byte, error) { return rewriteDecoded(b, &streaming) }},
		{"vllm-prefill", VLLMPrefillBody},
	} {
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
