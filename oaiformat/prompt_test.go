package oaiformat

import (
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/wire"
)

func TestPromptKeys(t *testing.T) {
	long := strings.Repeat("word ", 40)
	chat := affinity.AppendChatKeys(nil, 16, []affinity.Message{{Role: "system", Content: long}, {Role: "user", Content: "hi there"}})
	for _, tc := range []struct {
		name string
		api  wire.API
		body string
		want []uint64
	}{
		{"chat string", wire.API_API_CHAT, `{"messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"hi there"}]}`, chat},
		{"chat parts", wire.API_API_CHAT, `{"messages":[{"role":"system","content":[{"type":"text","text":"` + long + `"}]},{"role":"user","content":"hi there"}]}`, chat},
		{"completion", wire.API_API_COMPLETION, `{"prompt":"` + long + `"}`, affinity.AppendKeys(nil, 16, long)},
		{"completion list", wire.API_API_COMPLETION, `{"prompt":["` + long + `"]}`, affinity.AppendKeys(nil, 16, long)},
		{"token ids", wire.API_API_COMPLETION, `{"prompt":[1,2,3]}`, nil},
		{"embeddings", wire.API_API_EMBEDDINGS, `{"input":"x"}`, nil},
		{"bad json", wire.API_API_CHAT, `{`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PromptKeys(nil, 16, tc.api, []byte(tc.body))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("PromptKeys = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRequestPrompt: the prompt of a request Read validated is the one
// PromptOf decodes from its body, escapes, parts and all.
func TestRequestPrompt(t *testing.T) {
	long := strings.Repeat("word ", 40)
	for _, tc := range []struct {
		api  wire.API
		body string
	}{
		{wire.API_API_CHAT, `{"messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"hi there"}]}`},
		{wire.API_API_CHAT, `{"messages":[{"role":"user","content":"tab\there, quote \" and \u00e9 and \\ back"}]}`},
		{wire.API_API_CHAT, `{"messages":[{"role":"user","content":"héllo wörld 日本語"}]}`},
		{wire.API_API_CHAT, `{"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},{"role":"user","content":null}]}`},
		{wire.API_API_CHAT, `{"messages":[{"role":"assistant","content":"","tool_calls":[]},{"role":"tool","content":"42"}]}`},
		{wire.API_API_COMPLETION, `{"prompt":"` + long + `"}`},
		{wire.API_API_COMPLETION, `{"prompt":"line\nbreak"}`},
		{wire.API_API_COMPLETION, `{"prompt":["` + long + `"]}`},
		{wire.API_API_COMPLETION, `{"prompt":["a","b"]}`},
		{wire.API_API_COMPLETION, `{"prompt":[1,2,3]}`},
	} {
		r, err := Read(tc.api, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		want, wantOK := PromptOf(tc.api, []byte(tc.body))
		got, ok := r.Prompt()
		if ok != wantOK || got.Chat != want.Chat || got.Text != want.Text || !slices.Equal(got.Messages, want.Messages) {
			t.Errorf("%s:\nRead(...).Prompt() = %+v, %v\nPromptOf          = %+v, %v", tc.body, got, ok, want, wantOK)
		}
		if !slices.Equal(got.AppendKeys(nil, 16), PromptKeys(nil, 16, tc.api, []byte(tc.body))) && ok {
			t.Errorf("%s: keys differ", tc.body)
		}
	}
}

// BenchmarkPromptKeys compares keying a chat prompt from its body (decoded
// again) and from what Read decoded.
func BenchmarkPromptKeys(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"system","content":"` + strings.Repeat("you are a careful assistant ", 40) + `"},{"role":"user","content":"` + strings.Repeat("a question about things ", 8) + `"}]}`)
	r, err := Read(wire.API_API_CHAT, body)
	if err != nil {
		b.Fatal(err)
	}
	var keys []uint64
	b.Run("body", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			keys = PromptKeys(keys[:0], 16, wire.API_API_CHAT, body)
		}
	})
	b.Run("read", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, _ := r.Prompt()
			keys = p.AppendKeys(keys[:0], 16)
		}
	})
}
