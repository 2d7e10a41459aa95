package oaiformat

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

func TestTokenText(t *testing.T) {
	for _, tc := range []struct {
		name string
		strs []string
		want string
		ends []int
	}{
		{"byte-level", []string{"<|im_start|>", "user", "Ċ", "Hello", "Ġworld", "Ġcaf", "Ã©"}, "<|im_start|>user\nHello world café", []int{12, 16, 17, 22, 28, 32, 34}},
		{"byte-level split character", []string{ByteLevelTokenStr([]byte(" \xe6")), ByteLevelTokenStr([]byte("\x97\xa5"))}, " 日", []int{2, 4}},
		{"sentencepiece", []string{"<s>", "▁Hello", "▁world", "<0x0A>", "!"}, "<s> Hello world\n!", []int{3, 9, 15, 16, 17}},
		{"plain", []string{"hello", " world"}, "hello world", []int{5, 11}},
		{"byte-level added token outside the alphabet", []string{"<｜begin▁of▁sentence｜>", "Ġhi"}, "<｜begin▁of▁sentence｜> hi", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ends := TokenText(nil, nil, tc.strs)
			if string(got) != tc.want {
				t.Fatalf("text %q, want %q", got, tc.want)
			}
			if tc.ends != nil && !slices.Equal(ends, tc.ends) {
				t.Fatalf("ends %v, want %v", ends, tc.ends)
			}
			if len(ends) != len(tc.strs) {
				t.Fatalf("%d ends for %d tokens", len(ends), len(tc.strs))
			}
		})
	}
}

func TestByteLevelRoundTrip(t *testing.T) {
	var all []byte
	var strs []string
	for b := range 256 {
		all = append(all, byte(b))
		strs = append(strs, ByteLevelTokenStr([]byte{byte(b)}))
	}
	strs = append(strs, "Ġ") // a space, so the form is detected
	all = append(all, ' ')
	got, _ := TokenText(nil, nil, strs)
	if string(got) != string(all) {
		t.Fatalf("round trip lost bytes")
	}
}

func TestTokenizeBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  wire.API
		body string
		want string
	}{
		{"chat", wire.API_API_CHAT, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"tools":[{"type":"function"}],"chat_template_kwargs":null}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"return_token_strs":true,"tools":[{"type":"function"}]}`},
		{"chat continue", wire.API_API_CHAT, `{"model":"m","messages":[{"role":"assistant","content":"x"}],"continue_final_message":true,"add_generation_prompt":false}`,
			`{"model":"m","messages":[{"role":"assistant","content":"x"}],"add_generation_prompt":false,"continue_final_message":true,"return_token_strs":true}`},
		{"completion", wire.API_API_COMPLETION, `{"model":"m","prompt":["once upon"],"max_tokens":3}`,
			`{"model":"m","prompt":"once upon","return_token_strs":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := TokenizeBody(tc.api, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			var g, w any
			_ = json.Unmarshal(got, &g)
			_ = json.Unmarshal([]byte(tc.want), &w)
			gb, _ := json.Marshal(g)
			wb, _ := json.Marshal(w)
			if string(gb) != string(wb) {
				t.Fatalf("got %s\nwant %s", got, tc.want)
			}
		})
	}
	if _, err := TokenizeBody(wire.API_API_EMBEDDINGS, []byte(`{"input":"x"}`)); err == nil {
		t.Fatal("embeddings tokenized")
	}
}
