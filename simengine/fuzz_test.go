package simengine

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzStreamRequest feeds arbitrary bodies to ExpectChoices and Stream:
// neither may panic, they must agree on what they accept, and every chunk
// must be JSON whose deltas add up, choice by choice, to the expected
// texts.
func FuzzStreamRequest(f *testing.F) {
	for _, tc := range expectCases {
		f.Add(tc.api == APIChat, []byte(tc.body))
		f.Add(tc.api == APIChat, []byte(withStream(tc.body, `"stream":true,"stream_options":{"include_usage":true}`)))
	}
	for _, b := range []string{
		`{"messages":`, `[1]`, `null`, `{"prompt":[1,2]}`, `{"prompt":"a","stop":["\u0000","\n"],"max_tokens":3}`,
		`{"messages":[{"role":"user","content":"\"\\\u2028"}],"continue_final_message":true}`,
		`{"model":"x","prompt":"a"}`, `{"prompt":"a","n":2}`,
	} {
		f.Add(true, []byte(b))
		f.Add(false, []byte(b))
	}
	e := newTestEngine(f, testConfig())
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		api := APICompletion
		if chat {
			api = APIChat
		}
		xs, xerr := ExpectChoices(api, body)
		text := map[int]*strings.Builder{}
		serr := e.Stream(t.Context(), api, body, func(c []byte) error {
			if !json.Valid(c) {
				t.Fatalf("invalid chunk %q", c)
			}
			var ch chunk
			_ = json.Unmarshal(c, &ch)
			for _, choice := range ch.Choices {
				sb := text[choice.Index]
				if sb == nil {
					sb = &strings.Builder{}
					text[choice.Index] = sb
				}
				if choice.Text != nil {
					sb.WriteString(*choice.Text)
				}
				if choice.Delta != nil && choice.Delta.Content != nil {
					sb.WriteString(*choice.Delta.Content)
				}
			}
			return nil
		})
		if xerr != nil {
			if _, ok := errors.AsType[*Error](xerr); !ok {
				t.Fatalf("Expect error %T %v", xerr, xerr)
			}
			if serr == nil {
				t.Fatalf("Stream accepted what Expect refused: %v", xerr)
			}
			return
		}
		if serr != nil {
			se, ok := errors.AsType[*Error](serr)
			if !ok || se.Code != "model_not_found" {
				t.Fatalf("Stream refused what Expect accepted: %v", serr)
			}
			return
		}
		if len(text) != len(xs) {
			t.Fatalf("streamed %d choices, want %d", len(text), len(xs))
		}
		for i, x := range xs {
			if sb := text[i]; sb == nil || sb.String() != x.Text {
				t.Fatalf("choice %d streamed %v, want %q", i, sb, x.Text)
			}
		}
	})
}
