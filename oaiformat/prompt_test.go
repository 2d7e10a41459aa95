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
