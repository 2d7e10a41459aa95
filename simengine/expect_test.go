package simengine

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

var expectCases = []struct {
	name string
	api  API
	body string
}{
	{"chat default", APIChat, chatJSON("", "user", "Tell me a story.")},
	{"chat length", APIChat, chatJSON(`"max_completion_tokens":3`, "user", "Tell me a story.")},
	{"chat max_tokens", APIChat, chatJSON(`"max_tokens":5`, "system", "Be brief.", "user", "Hello there!")},
	{"chat parts", APIChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"world"}]}],"max_tokens":7}`},
	{"chat stop", APIChat, chatJSON(`"stop":["e"]`, "user", "Tell me a story.")},
	{"completion default", APICompletion, completionJSON("Once upon a time,", "")},
	{"completion length", APICompletion, completionJSON("Once upon a time,", `"max_tokens":4`)},
	{"completion array prompt", APICompletion, `{"prompt":["Once upon a time,"],"max_tokens":9}`},
	{"completion stop", APICompletion, completionJSON("Once upon a time,", `"stop":"o"`)},
	{"completion vocab prompt", APICompletion, completionJSON("the water and the sun", `"max_tokens":30`)},
}

func withStream(body, stream string) string {
	return strings.TrimSuffix(body, "}") + "," + stream + "}"
}

func TestHTTPMatchesExpect(t *testing.T) {
	e := newTestEngine(t, testConfig())
	srv := newTestServer(t, e)
	for _, tc := range expectCases {
		t.Run(tc.name, func(t *testing.T) {
			x := mustExpect(t, tc.api, tc.body)
			if x.Text != strings.Join(x.Tokens, "") {
				t.Fatalf("Expect text %q != joined tokens %q", x.Text, x.Tokens)
			}
			for _, variant := range []struct {
				name, stream string
				usage        bool
			}{
				{"stream", `"stream":true`, false},
				{"stream usage", `"stream":true,"stream_options":{"include_usage":true}`, true},
			} {
				t.Run(variant.name, func(t *testing.T) {
					resp := post(t, t.Context(), srv.URL+path(tc.api), withStream(tc.body, variant.stream))
					defer resp.Body.Close()
					if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
						t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
					}
					tr := readSSE(t, tc.api, resp.Body)
					if !slices.Equal(tr.deltas, x.Tokens) {
						t.Fatalf("deltas %q, want %q", tr.deltas, x.Tokens)
					}
					if tr.finish != x.FinishReason {
						t.Fatalf("finish %q, want %q", tr.finish, x.FinishReason)
					}
					if tc.api == APIChat && !tr.sawRole {
						t.Fatal("no role chunk")
					}
					for i, raw := range tr.raw {
						has := strings.Contains(string(raw), `"usage":`)
						if has != variant.usage {
							t.Fatalf("chunk %d %s: usage field present=%v, want %v", i, raw, has, variant.usage)
						}
					}
					if !variant.usage {
						if tr.usage != nil {
							t.Fatal("usage chunk without include_usage")
						}
						return
					}
					want := usage{PromptTokens: x.PromptTokens, CompletionTokens: x.CompletionTokens, TotalTokens: x.PromptTokens + x.CompletionTokens}
					if tr.usage == nil || *tr.usage != want {
						t.Fatalf("usage %+v, want %+v", tr.usage, want)
					}
				})
			}
			t.Run("non-stream", func(t *testing.T) {
				resp := post(t, t.Context(), srv.URL+path(tc.api), tc.body)
				defer resp.Body.Close()
				raw, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, raw)
				}
				var got struct {
					ID      string `json:"id"`
					Object  string `json:"object"`
					Model   string `json:"model"`
					Choices []struct {
						Message *struct {
							Role    string `json:"role"`
							Content string `json:"content"`
						} `json:"message"`
						Text         *string `json:"text"`
						FinishReason string  `json:"finish_reason"`
					} `json:"choices"`
					Usage usage `json:"usage"`
				}
				if err := json.Unmarshal(raw, &got); err != nil {
					t.Fatalf("%s: %v", raw, err)
				}
				if len(got.Choices) != 1 {
					t.Fatalf("choices: %s", raw)
				}
				c := got.Choices[0]
				var text string
				switch tc.api {
				case APIChat:
					if got.Object != "chat.completion" || c.Message == nil || c.Message.Role != "assistant" {
						t.Fatalf("bad chat response %s", raw)
					}
					text = c.Message.Content
				case APICompletion:
					if got.Object != "text_completion" || c.Text == nil {
						t.Fatalf("bad completion response %s", raw)
					}
					text = *c.Text
				}
				if text != x.Text || c.FinishReason != x.FinishReason {
					t.Fatalf("got %q/%s, want %q/%s", text, c.FinishReason, x.Text, x.FinishReason)
				}
				if want := (usage{PromptTokens: x.PromptTokens, CompletionTokens: x.CompletionTokens, TotalTokens: x.PromptTokens + x.CompletionTokens}); got.Usage != want {
					t.Fatalf("usage %+v, want %+v", got.Usage, want)
				}
				if got.Model != "sim-model" || got.ID == "" {
					t.Fatalf("envelope %s", raw)
				}
			})
		})
	}
}

func TestExpectModel(t *testing.T) {
	tests := []struct {
		name   string
		api    API
		body   string
		prompt int
		finish string
		tokens int // -1: do not check
	}{
		{"chat prompt tokens", APIChat, chatJSON(`"max_tokens":2`, "user", "hello  there\tfriend"), 5, "length", 2},
		{"chat content parts", APIChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_tokens":1}`, 3, "length", 1},
		{"chat null content", APIChat, `{"messages":[{"role":"user","content":null}],"max_tokens":1}`, 2, "length", 1},
		{"continue final", APIChat, `{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"the sun"}],"continue_final_message":true,"max_tokens":1}`, 5, "length", 1},
		{"continue final not assistant", APIChat, `{"messages":[{"role":"user","content":"hi"}],"continue_final_message":true,"max_tokens":1}`, 3, "length", 1},
		{"completion empty prompt", APICompletion, `{"prompt":"","max_tokens":2}`, 0, "length", 2},
		{"completion prompt tokens", APICompletion, `{"prompt":"one two three","max_tokens":2}`, 3, "length", 2},
		{"default max tokens", APICompletion, `{"prompt":"x"}`, 1, "", -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := mustExpect(t, tc.api, tc.body)
			if x.PromptTokens != tc.prompt {
				t.Errorf("prompt tokens %d, want %d", x.PromptTokens, tc.prompt)
			}
			if tc.finish != "" && x.FinishReason != tc.finish {
				t.Errorf("finish %q, want %q", x.FinishReason, tc.finish)
			}
			if tc.tokens >= 0 && x.CompletionTokens != tc.tokens {
				t.Errorf("completion tokens %d, want %d", x.CompletionTokens, tc.tokens)
			}
			if x.CompletionTokens > DefaultMaxTokens {
				t.Errorf("completion tokens %d over the default", x.CompletionTokens)
			}
			for _, tok := range x.Tokens[:x.CompletionTokens] {
				w, ok := strings.CutPrefix(tok, " ")
				if _, in := inVocab[w]; !ok || !in {
					t.Errorf("token %q is not a space and a vocabulary word", tok)
				}
			}
		})
	}
}

// Without a stop string the rendered prompt decides everything, so a chat
// request ends (by stop) after at least eosMinRun tokens.
func TestEOSNeedsFourTokens(t *testing.T) {
	for _, prompt := range []string{"a", "b", "Hello!", "What is 2+2?", "Tell me a story.", "x y z"} {
		x := mustExpect(t, APIChat, chatJSON("", "user", prompt))
		if x.FinishReason == finishStop && x.CompletionTokens < eosMinRun {
			t.Errorf("%q: stopped after %d tokens", prompt, x.CompletionTokens)
		}
	}
}

func TestStopStrings(t *testing.T) {
	base := completionJSON("Once upon a time,", `"max_tokens":40`)
	full := mustExpect(t, APICompletion, base)
	if len(full.Tokens) < 6 {
		t.Fatalf("need a longer output, got %q", full.Tokens)
	}
	tests := []struct {
		name string
		stop string
	}{
		{"token boundary", full.Tokens[2] + full.Tokens[3]},
		{"inside token", full.Tokens[3][2:] + full.Tokens[4]},
		{"first char", full.Tokens[0][:2]},
		{"absent", "zzz"},
		{"newline absent", "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := mustExpect(t, APICompletion, completionJSON("Once upon a time,", `"max_tokens":40,"stop":[`+jsonString(tc.stop)+`]`))
			before, _, found := strings.Cut(full.Text, tc.stop)
			if x.Text != before {
				t.Fatalf("text %q, want %q", x.Text, before)
			}
			if !found {
				if x.FinishReason != full.FinishReason || x.CompletionTokens != full.CompletionTokens {
					t.Fatalf("absent stop changed the outcome: %+v", x)
				}
				return
			}
			whole := 0
			for n := 0; whole < len(full.Tokens) && n+len(full.Tokens[whole]) <= len(before); whole++ {
				n += len(full.Tokens[whole])
			}
			if x.FinishReason != "stop" || x.CompletionTokens != whole {
				t.Fatalf("finish %q tokens %d, want stop %d", x.FinishReason, x.CompletionTokens, whole)
			}
		})
	}
}

func TestVocabulary(t *testing.T) {
	if len(vocab) != 256 {
		t.Fatalf("%d words", len(vocab))
	}
	seen := map[string]bool{}
	for _, w := range vocab {
		if seen[w] || w == "" || strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Fatalf("bad or duplicate word %q", w)
		}
		seen[w] = true
	}
}

// Resuming with the prompt plus the text received so far yields exactly the
// rest of the uninterrupted output: what the broker relies on to move a
// request to another engine.
func TestContinuation(t *testing.T) {
	const maxTokens = 64
	e := newTestEngine(t, testConfig())
	tests := []struct {
		name string
		api  API
		body func(sofar string, maxTokens int) string
	}{
		{"completion", APICompletion, func(sofar string, n int) string {
			return `{"prompt":` + jsonString("Once upon a time,"+sofar) + `,"max_tokens":` + itoa(n) + `}`
		}},
		{"completion vocab prompt", APICompletion, func(sofar string, n int) string {
			return `{"prompt":` + jsonString("the water and the sun"+sofar) + `,"max_tokens":` + itoa(n) + `}`
		}},
		{"completion length", APICompletion, func(sofar string, n int) string {
			return `{"prompt":` + jsonString("Once upon a time,"+sofar) + `,"max_tokens":` + itoa(n-maxTokens+8) + `}`
		}},
		{"chat continue_final_message", APIChat, func(sofar string, n int) string {
			if sofar == "" {
				return chatJSON(`"max_completion_tokens":`+itoa(n), "user", "Tell me a story.")
			}
			return chatJSON(`"max_completion_tokens":`+itoa(n)+`,"continue_final_message":true`,
				"user", "Tell me a story.", "assistant", sofar)
		}},
		{"chat continue from empty", APIChat, func(sofar string, n int) string {
			return chatJSON(`"max_completion_tokens":`+itoa(n)+`,"continue_final_message":true`,
				"user", "Tell me a story.", "assistant", sofar)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			full := mustExpect(t, tc.api, tc.body("", maxTokens))
			if full.CompletionTokens < 5 {
				t.Fatalf("need a longer output, got %q", full.Tokens)
			}
			for k := 0; k <= len(full.Tokens); k++ {
				if k == len(full.Tokens) && full.FinishReason == finishLength {
					break // no budget left to resume with
				}
				body := tc.body(strings.Join(full.Tokens[:k], ""), maxTokens-k)
				tr, err := stream(t, e, tc.api, body)
				if err != nil {
					t.Fatalf("k=%d: %v", k, err)
				}
				if want := full.Tokens[k:]; !slices.Equal(tr.deltas, want) && !(len(tr.deltas) == 0 && len(want) == 0) {
					t.Fatalf("k=%d: got %q, want %q", k, tr.deltas, want)
				}
				if tr.finish != full.FinishReason {
					t.Fatalf("k=%d: finish %q, want %q", k, tr.finish, full.FinishReason)
				}
				if tr.usage == nil || tr.usage.PromptTokens != full.PromptTokens+k || tr.usage.CompletionTokens != full.CompletionTokens-k {
					t.Fatalf("k=%d: usage %+v, full %+v", k, tr.usage, full)
				}
			}
		})
	}
}
