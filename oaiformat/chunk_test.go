package oaiformat

import (
	"encoding/json"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

func TestRewriteChunk(t *testing.T) {
	u := &wire.Usage{PromptTokens: 5, CompletionTokens: 7, TotalTokens: 12}
	for _, tc := range []struct {
		name string
		raw  string
		id   string
		u    *wire.Usage
		want string
	}{
		{"id", `{"id":"b","object":"chat.completion.chunk","choices":[{"delta":{"content":"x"}}]}`, "a", nil,
			`{"id":"a","object":"chat.completion.chunk","choices":[{"delta":{"content":"x"}}]}`},
		{"usage members kept", `{"id":"b","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`, "a", u,
			`{"id":"a","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`},
		{"usage added", `{"choices":[]}`, "", u, `{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`},
		{"empty object", `{}`, "a", u, `{"id":"a","usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`},
		{"empty object, usage only", `{ }`, "", u, `{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`},
		{"not an object", `[1]`, "a", u, `[1]`},
		{"nothing to do", `{"id":"b"}`, "", nil, `{"id":"b"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RewriteChunk([]byte(tc.raw), tc.id, tc.u); string(got) != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// FuzzRewriteChunk holds the one-pass chunk rewrite to the encoding/json
// one.
func FuzzRewriteChunk(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","choices":[{"delta":{"content":"a"}}]}`,
		`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":null}}`,
		`{"\u0069d":"x","usage":{"pr\u006fmpt_tokens":1}}`, `{"usage":null}`, `{"usage":[]}`, `null`, `{`,
	} {
		f.Add([]byte(s), "id-1", true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, id string, withUsage bool) {
		var u *wire.Usage
		if withUsage {
			u = &wire.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}
		}
		got := RewriteChunk(raw, id, u)
		want := rewriteChunkDecoded(raw, id, u)
		if id == "" && u == nil {
			want = raw
		}
		if string(got) == string(raw) && string(want) == string(raw) {
			return
		}
		sameJSON(t, raw, got, want)
	})
}

func TestChunkIDAndReasoning(t *testing.T) {
	if id := ChunkID([]byte(`{"id":"chatcmpl-1","choices":[]}`)); id != "chatcmpl-1" {
		t.Errorf("ChunkID %q", id)
	}
	for _, tc := range []struct {
		name string
		raw  string
		want bool
	}{
		{"reasoning_content", `{"choices":[{"delta":{"reasoning_content":"Let me think"}}]}`, true},
		{"reasoning", `{"choices":[{"delta":{"reasoning":"hmm"}}]}`, true},
		{"empty reasoning", `{"choices":[{"delta":{"reasoning_content":"","content":"a"}}]}`, false},
		{"content that says reasoning", `{"choices":[{"delta":{"content":"\"reasoning\""}}]}`, false},
		{"no choices", `{"choices":[]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Reasoning([]byte(tc.raw)); got != tc.want {
				t.Errorf("Reasoning(%s) = %v", tc.raw, got)
			}
		})
	}
}

func TestContinuation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		api       wire.API
		body      string
		want      string
		remaining int
	}{
		{"chat", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":10,"min_tokens":4,"stream":true}`,
			`{"add_generation_prompt":false,"continue_final_message":true,"max_tokens":7,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a \"b\"\n"}],"min_tokens":1,"stream":true}`, 7},
		{"completion", wire.API_API_COMPLETION, `{"prompt":["p: "],"max_completion_tokens":3}`,
			`{"max_completion_tokens":0,"prompt":"p: a \"b\"\n"}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, rem, err := Continuation(tc.api, []byte(tc.body), "a \"b\"\n", 3)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want || rem != tc.remaining {
				t.Errorf("\n got %s %d\nwant %s %d", got, rem, tc.want, tc.remaining)
			}
		})
	}
	if _, _, err := Continuation(wire.API_API_COMPLETION, []byte(`{"prompt":["a","b"]}`), "x", 1); err == nil {
		t.Error("two prompts continued")
	}
}

func TestStops(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      []string
		err       bool
	}{
		{"absent", ``, nil, false}, {"null", ` null `, nil, false}, {"one", `"\n"`, []string{"\n"}, false},
		{"empty", `""`, nil, false}, {"list", `["a","","b"]`, []string{"a", "b"}, false},
		{"number", `1`, nil, true}, {"mixed", `["a",1]`, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Stops(json.RawMessage(tc.raw))
			if (err != nil) != tc.err || len(got) != len(tc.want) {
				t.Fatalf("Stops(%s) = %q, %v", tc.raw, got, err)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("Stops(%s) = %q", tc.raw, got)
				}
			}
		})
	}
}

// FuzzAppendString: what AppendString writes decodes to what
// encoding/json decodes from its own encoding of the string.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "\n\r\t\b\f\x00\x1f", "\u2028\u2029é", "\xc3", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := AppendString([]byte("x"), s)
		if got[0] != 'x' {
			t.Fatal("prefix lost")
		}
		var a, b string
		if err := json.Unmarshal(got[1:], &a); err != nil {
			t.Fatalf("%q: %s does not decode: %v", s, got[1:], err)
		}
		ref, _ := json.Marshal(s)
		if err := json.Unmarshal(ref, &b); err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Fatalf("%q: decodes to %q, encoding/json's to %q", s, a, b)
		}
	})
}

func TestUsage(t *testing.T) {
	u := &wire.Usage{PromptTokens: 5, CompletionTokens: 7, TotalTokens: 12}
	for _, tc := range []struct{ name, raw, want string }{
		{"members kept", `{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`,
			`{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}`},
		{"no usage", `{"choices":[]}`, `{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}`},
		{"no chunk", ``, `{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}`},
		{"escaped key", `{"usage":{"c\u0061ched":1,"prompt_tokens":1}}`, `{"cached":1,"completion_tokens":7,"prompt_tokens":5,"total_tokens":12}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Usage([]byte(tc.raw), u); string(got) != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestChunkIDAsEncodingJSON: ChunkID reads what encoding/json reads.
func TestChunkIDAsEncodingJSON(t *testing.T) {
	for _, raw := range []string{
		`{"id":"chatcmpl-1","choices":[]}`,
		`{"object":"chat.completion.chunk","id":"cmpl-2","choices":[{"delta":{"content":"x"}}]}`,
		`{"ID":"upper"}`,
		`{"id":"first","Id":"last"}`,
		`{"\u0069d":"escaped key"}`,
		`{"id":"esc\"aped"}`,
		`{"id":"\u00e9t\u00e9"}`,
		`{"id":"héllo"}`,
		`{"id":7}`,
		`{"id":null}`,
		`{"choices":[{"id":"nested"}]}`,
		`{"id":"x"`,
		`[1]`,
		``,
	} {
		var head struct {
			ID string `json:"id"`
		}
		want := ""
		if json.Unmarshal([]byte(raw), &head) == nil {
			want = head.ID
		}
		if got := ChunkID([]byte(raw)); got != want {
			t.Errorf("ChunkID(%s) = %q, encoding/json reads %q", raw, got, want)
		}
	}
}

func BenchmarkChunkID(b *testing.B) {
	raw := []byte(`{"id":"chatcmpl-3f1c9e0a8b7d4c2e","object":"chat.completion.chunk","created":1764720000,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)
	b.ReportAllocs()
	for b.Loop() {
		_ = ChunkID(raw)
	}
}

func TestPrefilledTokens(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		n    int
		ok   bool
		name string
	}{
		{`{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":3,"total_tokens":903,"prompt_tokens_details":{"cached_tokens":640}}}`, 260, true, "vLLM"},
		{`{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":3,"total_tokens":903,"prompt_tokens_details":{"cached_tokens":0}}}`, 900, true, "nothing cached"},
		{`{"text":"x","meta_info":{"prompt_tokens":500,"cached_tokens":100}}`, 400, true, "SGLang meta_info"},
		{`{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":3,"total_tokens":903}}`, 0, false, "no details"},
		{`{"choices":[],"usage":{"prompt_tokens":900,"prompt_tokens_details":null}}`, 0, false, "null details"},
		{`{"choices":[],"usage":{"prompt_tokens":9,"prompt_tokens_details":{}}}`, 0, false, "no cached_tokens"},
		{``, 0, false, "empty"},
		{`not json`, 0, false, "not JSON"},
	} {
		if n, ok := PrefilledTokens([]byte(tt.raw)); n != tt.n || ok != tt.ok {
			t.Errorf("%s: PrefilledTokens = %d, %v; want %d, %v", tt.name, n, ok, tt.n, tt.ok)
		}
	}
}
