package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// engineChunk is the struct an engine chunk decodes into with
// encoding/json, the reference Scan is checked against: Scan must agree
// with decoding into it.
type engineChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     uint32 `json:"prompt_tokens"`
		CompletionTokens uint32 `json:"completion_tokens"`
		TotalTokens      uint32 `json:"total_tokens"`
	} `json:"usage"`
}

// reference decodes raw the way the agent did and returns the Fields that
// Scan must produce.
func reference(raw []byte) (Fields, error) {
	var ec engineChunk
	if err := json.Unmarshal(raw, &ec); err != nil {
		return Fields{}, err
	}
	var f Fields
	f.Choices = len(ec.Choices)
	if len(ec.Choices) > 0 {
		c := ec.Choices[0]
		f.Text = c.Delta.Content + c.Text
		if c.FinishReason != nil {
			f.HasFinish, f.FinishReason = true, *c.FinishReason
		}
	}
	if u := ec.Usage; u != nil {
		f.HasUsage = true
		f.PromptTokens, f.CompletionTokens, f.TotalTokens = u.PromptTokens, u.CompletionTokens, u.TotalTokens
	}
	return f, nil
}

// checkParity fails t unless Scan and encoding/json agree on raw.
func checkParity(t *testing.T, raw []byte) {
	t.Helper()
	want, werr := reference(raw)
	var got Fields
	gerr := Scan(raw, &got)
	switch {
	case werr != nil && gerr == nil:
		t.Fatalf("Scan(%q) = %+v, nil; encoding/json: %v", raw, got, werr)
	case werr == nil && gerr != nil:
		t.Fatalf("Scan(%q): %v; encoding/json accepts it: %+v", raw, gerr, want)
	case werr != nil:
		if got != (Fields{}) {
			t.Fatalf("Scan(%q) failed (%v) but left %+v", raw, gerr, got)
		}
	case got != want:
		t.Fatalf("Scan(%q)\n got %+v\nwant %+v", raw, got, want)
	}
	// ScanSpan finds the same, its text a span of raw or a string.
	var sp Fields
	serr := ScanSpan(raw, &sp)
	if (serr == nil) != (gerr == nil) {
		t.Fatalf("ScanSpan(%q): %v; Scan: %v", raw, serr, gerr)
	}
	if sp.TextEnd > sp.TextStart {
		if sp.Text != "" {
			t.Fatalf("ScanSpan(%q): a span and a text %q", raw, sp.Text)
		}
		sp.Text = string(raw[sp.TextStart:sp.TextEnd])
	}
	sp.TextStart, sp.TextEnd = 0, 0
	if sp != got {
		t.Fatalf("ScanSpan(%q)\n got %+v\nwant %+v", raw, sp, got)
	}
}

const chatChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":null,"finish_reason":null}]}`

// benchChunk is a chat chunk as vLLM sends it (~200 bytes).
const benchChunk = `{"id":"chatcmpl-b7f0c1e6a2d84b1f9d3e5a7c","object":"chat.completion.chunk","created":1718000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":null,"finish_reason":null}]}`

var typical = []struct {
	name string
	raw  string
	want Fields
}{
	{"chat", chatChunk, Fields{Choices: 1, Text: " hi"}},
	{"chat vllm", benchChunk, Fields{Choices: 1, Text: " hi"}},
	{"chat role first", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		Fields{Choices: 1}},
	{"chat finish", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`,
		Fields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{"chat finish length", `{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		Fields{Choices: 1, HasFinish: true, FinishReason: "length"}},
	{"chat finish unusual", `{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"max_time"}]}`,
		Fields{Choices: 1, HasFinish: true, FinishReason: "max_time"}},
	{"chat finish escaped", `{"choices":[{"delta":{},"finish_reason":"st\u006fp"}]}`,
		Fields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{"completions", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hi","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
		Fields{Choices: 1, Text: " hi"}},
	{"completions finish", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
		Fields{Choices: 1, HasFinish: true, FinishReason: "length"}},
	{"usage only", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}`,
		Fields{HasUsage: true, PromptTokens: 5, CompletionTokens: 16, TotalTokens: 21}},
	{"usage with details", `{"id":"c","choices":[],"usage":{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":null}}`,
		Fields{HasUsage: true, PromptTokens: 5, CompletionTokens: 16, TotalTokens: 21}},
	{"continuous usage", `{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
		Fields{Choices: 1, Text: "a", HasUsage: true, PromptTokens: 5, CompletionTokens: 1, TotalTokens: 6}},
	{"usage max", `{"usage":{"prompt_tokens":4294967295,"completion_tokens":0,"total_tokens":4294967295}}`,
		Fields{HasUsage: true, PromptTokens: 4294967295, TotalTokens: 4294967295}},
	{"usage empty", `{"usage":{}}`, Fields{HasUsage: true}},
	{"tool call delta", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},"logprobs":null,"finish_reason":null}]}`,
		Fields{Choices: 1}},
	{"tool calls finish", `{"id":"c","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"}"}}]},"finish_reason":"tool_calls"}]}`,
		Fields{Choices: 1, HasFinish: true, FinishReason: "tool_calls"}},
	{"reasoning", `{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":null},"finish_reason":null}]}`,
		Fields{Choices: 1}},
	{"chat logprobs", `{"id":"c","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":{"content":[{"token":" hi","logprob":-0.0123,"bytes":[32,104,105],"top_logprobs":[{"token":" hi","logprob":-0.0123,"bytes":[32,104,105]},{"token":" hello","logprob":-4.5e-3,"bytes":null}]}]},"finish_reason":null}]}`,
		Fields{Choices: 1, Text: " hi"}},
	{"completion logprobs", `{"id":"c","choices":[{"index":0,"text":" hi","logprobs":{"text_offset":[0],"token_logprobs":[-0.5],"tokens":[" hi"],"top_logprobs":[{" hi":-0.5,"Hi":-1.25E+0}]},"finish_reason":null}]}`,
		Fields{Choices: 1, Text: " hi"}},
	{"unicode escapes", `{"choices":[{"delta":{"content":"caf\u00e9 \ud83d\ude00 \u4e2d\n\t\"\\\/"}}]}`,
		Fields{Choices: 1, Text: "café 😀 中\n\t\"\\/"}},
	{"raw utf8", `{"choices":[{"delta":{"content":"café 😀 中文"}}]}`, Fields{Choices: 1, Text: "café 😀 中文"}},
	{"lone surrogate", `{"choices":[{"delta":{"content":"a\ud800b\udc00c\ud800\u0041"}}]}`,
		Fields{Choices: 1, Text: "a\uFFFDb\uFFFDc\uFFFDA"}},
	{"invalid utf8", "{\"choices\":[{\"delta\":{\"content\":\"a\xffb\xed\xa0\x80\"}}]}", Fields{Choices: 1, Text: "a\uFFFDb\uFFFD\uFFFD\uFFFD"}},
	{"content and text", `{"choices":[{"text":"b","delta":{"content":"a"}}]}`, Fields{Choices: 1, Text: "ab"}},
	{"n>1", `{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"},"finish_reason":"stop"}]}`,
		Fields{Choices: 2, Text: "a"}},
	{"sglang", `{"id":"0b0b4c5e","object":"chat.completion.chunk","created":1718000000,"model":"default","choices":[{"index":0,"delta":{"role":null,"content":" hi","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`,
		Fields{Choices: 1, Text: " hi"}},
	{"sglang finish", `{"id":"0b","object":"chat.completion.chunk","created":1,"model":"default","choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":128009}],"usage":null}`,
		Fields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{"openai spaced", "{\n  \"id\": \"chatcmpl-1\",\n  \"choices\": [ { \"index\": 0, \"delta\": { \"content\": \"x\" }, \"finish_reason\": null } ],\n  \"usage\": null\n}\n",
		Fields{Choices: 1, Text: "x"}},
	{"null", `null`, Fields{}},
	{"empty object", ` {} `, Fields{}},
}

func TestScanTypical(t *testing.T) {
	for _, tc := range typical {
		t.Run(tc.name, func(t *testing.T) {
			var got Fields
			if err := Scan([]byte(tc.raw), &got); err != nil {
				t.Fatalf("Scan: %v", err)
			}
			if got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
			checkParity(t, []byte(tc.raw))
		})
	}
}

// quirks are inputs where encoding/json does something surprising; each is
// checked against encoding/json, and against the stated expectation so
// that a change in either shows up.
var quirks = []struct {
	raw  string
	want *Fields // nil: an error
}{
	// Whole-document validation.
	{``, nil},
	{` `, nil},
	{`{}x`, nil},
	{`{} {}`, nil},
	{"\t\r\n {} \t\r\n", &Fields{}},
	{`{"id":1,}`, nil},
	{`{"id":01}`, nil},
	{`{"id":-}`, nil},
	{`{"id":1.}`, nil},
	{`{"id":1e}`, nil},
	{`{"id":.5}`, nil},
	{`{"id":+1}`, nil},
	{`{"id":-0.0e-0}`, &Fields{}},
	{`{"id":tru}`, nil},
	{`{"id":nul}`, nil},
	{`{"id":NaN}`, nil},
	{`{"id":"a` + "\x01" + `"}`, nil},
	{`{"id":"\x"}`, nil},
	{`{"id":"\'"}`, nil},
	{`{"id":"\u12"}`, nil},
	{`{"id":"\u12g4"}`, nil},
	{"{\"id\":\"\x7f\"}", &Fields{}},
	{"\xef\xbb\xbf{}", nil},
	{`{"id":[1,2,]}`, nil},
	{`{"id":[1 2]}`, nil},
	{`{"id":{"a" 1}}`, nil},
	{`{"id":{"a":1 "b":2}}`, nil},
	{`{'id':1}`, nil},
	{`{"choices":[]`, nil},
	{`{"choices":[{"text":"a"}]}]`, nil},
	// Top-level values other than objects.
	{`null`, &Fields{}},
	{` null `, &Fields{}},
	{`nul`, nil},
	{`[]`, nil},
	{`"x"`, nil},
	{`1`, nil},
	{`true`, nil},
	// Key matching.
	{`{"CHOICES":[{"TEXT":"a","DELTA":{"CONTENT":"b"},"FINISH_REASON":"x"}],"USAGE":{"PROMPT_TOKENS":1,"Completion_Tokens":2,"total_TOKENS":3}}`,
		&Fields{Choices: 1, Text: "ba", HasFinish: true, FinishReason: "x", HasUsage: true, PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}},
	{`{"\u0063hoices":[{"t\u0065xt":"a"}]}`, &Fields{Choices: 1, Text: "a"}},
	{`{"choice\u017f":[{"text":"a"}]}`, &Fields{Choices: 1, Text: "a"}},              // LATIN SMALL LETTER LONG S folds to 's'
	{"{\"choice\u017f\":[{\"text\":\"a\"}]}", &Fields{Choices: 1, Text: "a"}},        // the same, raw
	{`{"usage":{"prompt_to\u212aens":7}}`, &Fields{HasUsage: true, PromptTokens: 7}}, // KELVIN SIGN folds to 'k'
	{"{\"usage\":{\"total_to\u212aens\":7}}", &Fields{HasUsage: true, TotalTokens: 7}},
	{`{"choices ":[{"text":"a"}]}`, &Fields{}},
	{`{"choice":[{"text":"a"}]}`, &Fields{}},
	{`{"finish_reason":"stop","text":"a","content":"b","prompt_tokens":1}`, &Fields{}},
	{"{\"choices\xff\":1}", &Fields{}},
	{`{"choices\u0000":1}`, &Fields{}},
	{`{"finish` + "\u0130" + `reason":1}`, &Fields{}},
	{`{"choices":[{"finish_reaſon":"stop"}]}`, &Fields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{`{"choices":[{"finish\u005freason":"stop"}]}`, &Fields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{"{\"choices\":[{\"finish\x7freason\":\"stop\"}]}", &Fields{Choices: 1}},
	// Duplicate keys: last wins, objects merge.
	{`{"choices":[{"text":"a"}],"choices":[{"text":"b"},{}]}`, &Fields{Choices: 2, Text: "b"}},
	{`{"choices":[{"text":"a"}],"choices":[{}]}`, &Fields{Choices: 1, Text: "a"}},
	{`{"choices":[{"text":"a"},{}],"choices":[null]}`, &Fields{Choices: 1, Text: "a"}},
	{`{"choices":[{"text":"a"}],"choices":[]}`, &Fields{}},
	{`{"choices":[{"text":"a"}],"choices":[],"choices":[{}]}`, &Fields{Choices: 1}},
	{`{"choices":[{"text":"a"}],"choices":null,"choices":[{}]}`, &Fields{Choices: 1}},
	{`{"choices":[{"text":"a","finish_reason":"stop"}],"choices":[{"delta":{"content":"b"}}]}`, &Fields{Choices: 1, Text: "ba", HasFinish: true, FinishReason: "stop"}},
	{`{"choices":[{"text":"a","text":"b"}]}`, &Fields{Choices: 1, Text: "b"}},
	{`{"choices":[{"text":"a","text":null}]}`, &Fields{Choices: 1, Text: "a"}},
	{`{"choices":[{"delta":{"content":"a"},"delta":{"role":"x"}}]}`, &Fields{Choices: 1, Text: "a"}},
	{`{"choices":[{"delta":{"content":"a","content":"b"}}]}`, &Fields{Choices: 1, Text: "b"}},
	{`{"choices":[{"delta":{"content":"a"},"delta":null}]}`, &Fields{Choices: 1, Text: "a"}},
	{`{"choices":[{"finish_reason":"stop","finish_reason":null}]}`, &Fields{Choices: 1}},
	{`{"choices":[{"finish_reason":null,"finish_reason":"length"}]}`, &Fields{Choices: 1, HasFinish: true, FinishReason: "length"}},
	{`{"usage":{"prompt_tokens":1},"usage":{"total_tokens":3}}`, &Fields{HasUsage: true, PromptTokens: 1, TotalTokens: 3}},
	{`{"usage":{"prompt_tokens":1},"usage":null}`, &Fields{}},
	{`{"usage":{"prompt_tokens":1},"usage":null,"usage":{"total_tokens":3}}`, &Fields{HasUsage: true, TotalTokens: 3}},
	{`{"usage":{"prompt_tokens":1,"prompt_tokens":null}}`, &Fields{HasUsage: true, PromptTokens: 1}},
	{`{"usage":{"prompt_tokens":1,"prompt_tokens":2}}`, &Fields{HasUsage: true, PromptTokens: 2}},
	{`{"choices":null}`, &Fields{}},
	{`{"choices":[null]}`, &Fields{Choices: 1}},
	{`{"choices":[null,null,{}]}`, &Fields{Choices: 3}},
	{`{"choices":[{"text":null,"delta":null,"finish_reason":null}]}`, &Fields{Choices: 1}},
	{`{"usage":null}`, &Fields{}},
	// Type mismatches, in any element.
	{`{"choices":{}}`, nil},
	{`{"choices":"x"}`, nil},
	{`{"choices":1}`, nil},
	{`{"choices":true}`, nil},
	{`{"choices":[1]}`, nil},
	{`{"choices":["x"]}`, nil},
	{`{"choices":[[]]}`, nil},
	{`{"choices":[false]}`, nil},
	{`{"choices":[{},1]}`, nil},
	{`{"choices":[{},{"text":5}]}`, nil},
	{`{"choices":[{},{"delta":{"content":true}}]}`, nil},
	{`{"choices":[{},{"finish_reason":1}]}`, nil},
	{`{"choices":[{"text":5}]}`, nil},
	{`{"choices":[{"text":true}]}`, nil},
	{`{"choices":[{"text":{}}]}`, nil},
	{`{"choices":[{"text":[]}]}`, nil},
	{`{"choices":[{"delta":"x"}]}`, nil},
	{`{"choices":[{"delta":[]}]}`, nil},
	{`{"choices":[{"delta":1}]}`, nil},
	{`{"choices":[{"delta":{"content":1}}]}`, nil},
	{`{"choices":[{"delta":{"content":{}}}]}`, nil},
	{`{"choices":[{"finish_reason":1}]}`, nil},
	{`{"choices":[{"finish_reason":false}]}`, nil},
	{`{"choices":[{"finish_reason":{}}]}`, nil},
	{`{"choices":[{"finish_reason":["stop"]}]}`, nil},
	{`{"usage":1}`, nil},
	{`{"usage":"x"}`, nil},
	{`{"usage":[]}`, nil},
	{`{"usage":true}`, nil},
	{`{"usage":{"prompt_tokens":1.5}}`, nil},
	{`{"usage":{"prompt_tokens":1.0}}`, nil},
	{`{"usage":{"prompt_tokens":-1}}`, nil},
	{`{"usage":{"prompt_tokens":-0}}`, nil},
	{`{"usage":{"prompt_tokens":1e2}}`, nil},
	{`{"usage":{"prompt_tokens":1E2}}`, nil},
	{`{"usage":{"prompt_tokens":4294967296}}`, nil},
	{`{"usage":{"prompt_tokens":18446744073709551616}}`, nil},
	{`{"usage":{"prompt_tokens":"1"}}`, nil},
	{`{"usage":{"prompt_tokens":true}}`, nil},
	{`{"usage":{"prompt_tokens":{}}}`, nil},
	{`{"usage":{"prompt_tokens":[]}}`, nil},
	{`{"usage":{"prompt_tokens":01}}`, nil},
	{`{"usage":{"prompt_tokens":0}}`, &Fields{HasUsage: true}},
	{`{"usage":{"prompt_tokens":0000}}`, nil},
	{`{"usage":{"prompt_tokens":00000000000000000000001}}`, nil},
	{`{"usage":{"prompt_tokens":1},"choices":[{"text":1}]}`, nil},
	// Unknown values are validated but may hold anything.
	{`{"id":{"choices":1,"usage":"x"},"x":[{"text":1}],"y":[true,false,null,-1.5e+3,"\u00e9",{}]}`, &Fields{}},
	{`{"choices":[{"logprobs":{"text":1,"delta":[]},"delta":{"x":{"content":1}}}]}`, &Fields{Choices: 1}},
}

func TestScanQuirks(t *testing.T) {
	for _, tc := range quirks {
		t.Run("", func(t *testing.T) {
			raw := []byte(tc.raw)
			var got Fields
			err := Scan(raw, &got)
			switch {
			case tc.want == nil && err == nil:
				t.Errorf("Scan(%q) = %+v, want an error", raw, got)
			case tc.want != nil && err != nil:
				t.Errorf("Scan(%q): %v", raw, err)
			case tc.want != nil && got != *tc.want:
				t.Errorf("Scan(%q)\n got %+v\nwant %+v", raw, got, *tc.want)
			}
			checkParity(t, raw)
		})
	}
}

func TestScanDepth(t *testing.T) {
	// encoding/json allows 10000 nested arrays and objects, counting the
	// chunk object itself; check the limit inside each container Scan
	// walks into.
	for _, tc := range []struct {
		prefix, suffix string
		depth          int // containers the nested value is in
	}{
		{`{"x":`, `}`, 1},
		{`{"usage":{"x":`, `}}`, 2},
		{`{"choices":[{"x":`, `}]}`, 3},
		{`{"choices":[{},{"x":`, `}]}`, 3},
		{`{"choices":[{"delta":{"x":`, `}}]}`, 4},
		{`{"x":{"y":[`, `]}}`, 3},
		{``, ``, 0},
	} {
		for _, n := range []int{maxDepth - tc.depth, maxDepth - tc.depth + 1} {
			arrays := tc.prefix + strings.Repeat("[", n) + strings.Repeat("]", n) + tc.suffix
			objects := tc.prefix + strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) + tc.suffix
			for _, raw := range []string{arrays, objects} {
				var f Fields
				err := Scan([]byte(raw), &f)
				if ok := n+tc.depth <= maxDepth && !strings.HasPrefix(raw, "["); (err == nil) != ok {
					t.Errorf("Scan(%.20q... at depth %d): %v, want ok=%v", raw, n+tc.depth, err, ok)
				}
				checkParity(t, []byte(raw))
			}
		}
	}
}

func TestScanTruncations(t *testing.T) {
	// Every prefix of every typical chunk, and every chunk with one byte
	// dropped or replaced.
	for _, tc := range typical {
		raw := []byte(tc.raw)
		for n := range len(raw) {
			checkParity(t, raw[:n])
			b := append(append([]byte(nil), raw[:n]...), raw[n+1:]...)
			checkParity(t, b)
			for _, c := range []byte{'"', '\\', '{', '}', '[', ']', ',', ':', ' ', '0', 'n', 0, 0x80} {
				b := append([]byte(nil), raw...)
				b[n] = c
				checkParity(t, b)
			}
		}
	}
}

// TestScanGenerated compares Scan with encoding/json on documents built from
// the fields Scan reads, spelled in every way encoding/json matches them,
// with values of every type, duplicates and occasional corruption.
func TestScanGenerated(t *testing.T) {
	n := 200000
	if testing.Short() {
		n = 20000
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		checkParity(t, genDoc(r))
	}
}

var keySpellings = map[string][]string{
	"choices":           {"choices", "Choices", "CHOICES", `\u0063hoices`, `choice\u017f`, "choiceſ", `ch\u004FICES`, "choice", "choices_"},
	"usage":             {"usage", "USAGE", `u\u0073age`, "uſage", "usagE", "usages"},
	"text":              {"text", "Text", `t\u0065xt`, "TEXT", "tex"},
	"delta":             {"delta", "DELTA", `\u0064elta`, "Delta", "delt"},
	"finish_reason":     {"finish_reason", "FINISH_REASON", `finish\u005freason`, "finiſh_reaſon", "finish-reason", "finishreason"},
	"content":           {"content", "CONTENT", `c\u006fntent`, "contenſ", "Content", "contents"},
	"prompt_tokens":     {"prompt_tokens", "PROMPT_TOKENS", "prompt_to\u212aens", `prompt_to\u212aen\u017f`, "prompt_token"},
	"completion_tokens": {"completion_tokens", "Completion_Tokens", `completion_\u0074okens`, "completion_to\u212aens"},
	"total_tokens":      {"total_tokens", "TOTAL_TOKENS", `total_to\u212Aens`, "total_tokens "},
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func genKey(r *rand.Rand, name string) string {
	if r.IntN(8) == 0 {
		return `"` + pick(r, []string{"id", "index", "logprobs", "object", "role", "x", "", `\u00e9`, "\xff"}) + `"`
	}
	return `"` + pick(r, keySpellings[name]) + `"`
}

// rare is true once in a while, for the generators' invalid choices.
func rare(r *rand.Rand) bool { return r.IntN(60) == 0 }

func ws(r *rand.Rand) string {
	if r.IntN(4) != 0 {
		return ""
	}
	if rare(r) {
		return pick(r, []string{"\f", "\v", "\u00a0", "\x00"})
	}
	return pick(r, []string{" ", "\n", "\t", "\r\n  "})
}

func genString(r *rand.Rand) string {
	var b strings.Builder
	b.WriteByte('"')
	for range r.IntN(6) {
		if rare(r) {
			b.WriteString(pick(r, []string{"\x01", "\n", `\x`, `\u12`, `\'`, `\U0041`, `\`}))
			continue
		}
		b.WriteString(pick(r, []string{"a", " hi", "é", "😀", `\n`, `\"`, `\\`, `\/`, `\b`, `\f`, `\r`, `\t`,
			`\u00e9`, `\ud83d\ude00`, `\ud83d`, `\ude00`, `\ud83dx`, `\ud83d\u0041`, `\uDBFF\uDFFF`, `\u0000`, `\uffff`,
			`\uD83D\uDE00`, `\ud83d\ud83d\ude00`, "\xff", "\xed\xa0\x80", "\xc3", "\xe2\x84", "\xf4\x90\x80\x80", "\xc0\xaf",
			"\x7f", "\ufffd", `'`, "\u2028"}))
	}
	if !rare(r) {
		b.WriteByte('"')
	}
	return b.String()
}

func genNumber(r *rand.Rand) string {
	if rare(r) {
		return pick(r, []string{"01", "-", "1.", ".5", "+1", "2e", "0x1", "1_0", "1e+", "--1", "00"})
	}
	if r.IntN(10) == 0 {
		return pick(r, []string{"4294967296", "99999999999", "18446744073709551616", "-1", "-0", "1.5", "1.0", "1e2", "1E+2", "0e0", "-12.5e-3"})
	}
	return pick(r, []string{"0", "1", "21", "4294967295", "4294967294", "1000000000", "9"})
}

func genValue(r *rand.Rand, kind string, depth int) string {
	// Mostly the right type, sometimes anything.
	if r.IntN(20) == 0 || kind == "" {
		return genAny(r, depth)
	}
	switch kind {
	case "string":
		if r.IntN(5) == 0 {
			return "null"
		}
		return genString(r)
	case "uint":
		if r.IntN(6) == 0 {
			return "null"
		}
		return genNumber(r)
	case "choices":
		if r.IntN(8) == 0 {
			return pick(r, []string{"null", "[]", "[ ]"})
		}
		var b strings.Builder
		b.WriteString("[" + ws(r))
		for i := range 1 + r.IntN(3) {
			if i > 0 {
				b.WriteString("," + ws(r))
			}
			if r.IntN(8) == 0 {
				b.WriteString("null")
			} else {
				b.WriteString(genObject(r, depth+1, map[string]string{"text": "string", "delta": "delta", "finish_reason": "string"}))
			}
			b.WriteString(ws(r))
		}
		b.WriteString("]")
		return b.String()
	case "delta":
		if r.IntN(8) == 0 {
			return "null"
		}
		return genObject(r, depth+1, map[string]string{"content": "string"})
	case "usage":
		if r.IntN(6) == 0 {
			return "null"
		}
		return genObject(r, depth+1, map[string]string{"prompt_tokens": "uint", "completion_tokens": "uint", "total_tokens": "uint"})
	}
	panic(kind)
}

func genAny(r *rand.Rand, depth int) string {
	switch n := r.IntN(9); {
	case n == 0 && depth < 6:
		return genObject(r, depth+1, nil)
	case n == 1 && depth < 6:
		return "[" + genAny(r, depth+1) + "," + genAny(r, depth+1) + "]"
	case n == 2:
		return genString(r)
	case n == 3:
		return genNumber(r)
	default:
		if rare(r) {
			return pick(r, []string{"nul", "tru", "[1,]", "{,}", "[", "}", "NaN", ""})
		}
		return pick(r, []string{"null", "true", "false", "{}", "[]", `"x"`, "1", "[ ]", "{ }"})
	}
}

func genObject(r *rand.Rand, depth int, fields map[string]string) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	var b strings.Builder
	b.WriteString("{" + ws(r))
	for i := range r.IntN(6) {
		if i > 0 {
			b.WriteString("," + ws(r))
		}
		if len(names) == 0 || r.IntN(5) == 0 {
			b.WriteString(`"` + pick(r, []string{"id", "index", "logprobs", "x", "Text", "Usage"}) + `"` + ws(r) + ":" + ws(r) + genAny(r, depth))
		} else {
			// Sorted choice so the run is reproducible despite map order.
			name := names[r.IntN(len(names))]
			for _, n := range names {
				if n < name && r.IntN(2) == 0 {
					name = n
				}
			}
			b.WriteString(genKey(r, name) + ws(r) + ":" + ws(r) + genValue(r, fields[name], depth))
		}
		b.WriteString(ws(r))
	}
	b.WriteString("}")
	return b.String()
}

func genDoc(r *rand.Rand) []byte {
	doc := []byte(ws(r) + genObject(r, 1, map[string]string{"choices": "choices", "usage": "usage"}) + ws(r))
	if r.IntN(20) == 0 && len(doc) > 0 {
		switch i := r.IntN(len(doc)); r.IntN(3) {
		case 0:
			doc = doc[:i]
		case 1:
			doc = append(doc[:i], doc[i+1:]...)
		default:
			doc[i] = pick(r, []byte(`{}[],:" \0nx1`))
		}
	}
	return doc
}

func FuzzScan(f *testing.F) {
	for _, tc := range typical {
		f.Add([]byte(tc.raw))
	}
	for _, tc := range quirks {
		f.Add([]byte(tc.raw))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		f.Add(genDoc(r))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkParity(t, raw)
	})
}

func BenchmarkScan(b *testing.B) {
	raw := []byte(benchChunk)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	var f Fields
	for b.Loop() {
		if err := Scan(raw, &f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodingJSON(b *testing.B) {
	raw := []byte(benchChunk)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var ec engineChunk
		if err := json.Unmarshal(raw, &ec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScanShapes covers the other chunk shapes the agent relays.
func BenchmarkScanShapes(b *testing.B) {
	for _, name := range []string{"chat", "chat finish", "completions", "usage only", "chat logprobs", "unicode escapes", "sglang"} {
		var raw []byte
		for _, tc := range typical {
			if tc.name == name {
				raw = []byte(tc.raw)
			}
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			var f Fields
			for b.Loop() {
				if err := Scan(raw, &f); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/encoding_json", func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				var ec engineChunk
				if err := json.Unmarshal(raw, &ec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func ExampleScan() {
	var f Fields
	err := Scan([]byte(`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":"stop"}]}`), &f)
	fmt.Printf("%v %+v\n", err, f)
	// Output: <nil> {Choices:1 Text: hi FinishReason:stop HasFinish:true HasUsage:false PromptTokens:0 CompletionTokens:0 TotalTokens:0 TextStart:0 TextEnd:0}
}

func TestMembers(t *testing.T) {
	var got []string
	err := Members([]byte(" {\"a\" : 1, \"b\\u0062\":{\"c\":[1,{}]},\"é\":\"x\"\n} "), func(key []byte, quoted bool, member, value []byte) {
		got = append(got, fmt.Sprintf("%s|%v|%s|%s", key, quoted, member, value))
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`a|false|"a" : 1|1`, `b\u0062|true|"b\u0062":{"c":[1,{}]}|{"c":[1,{}]}`, `é|true|"é":"x"|"x"`}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("members %q, want %q", got, want)
	}
	if err := Members([]byte(`{}`), func([]byte, bool, []byte, []byte) { t.Error("member in {}") }); err != nil {
		t.Error(err)
	}
	// Errors where encoding/json errors, and on anything but an object.
	for _, bad := range []string{``, ` `, `null`, `[]`, `1`, `{`, `{"a"}`, `{"a":1,}`, `{"a":1}x`, `{"a":tru}`, `{"a":"\x01"}`} {
		if err := Members([]byte(bad), func([]byte, bool, []byte, []byte) {}); err == nil {
			t.Errorf("Members(%q): no error", bad)
		}
	}
}

// membersReference walks the object raw with encoding/json: each member's
// name, unescaped, and its value as written; an error where Members must
// refuse raw.
func membersReference(raw []byte) ([][2]string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("null, not an object")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	var out [][2]string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, [2]string{k.(string), string(v)})
	}
	return out, nil
}

// checkMembers fails t unless Members and encoding/json agree on raw: the
// same verdict, and the same members in order, each key unescaped to the
// name encoding/json reads (and needing no unescaping unless quoted says
// so), each value as written, each member its quoted key through its
// value.
func checkMembers(t *testing.T, raw []byte) {
	t.Helper()
	want, werr := membersReference(raw)
	var got [][2]string
	gerr := Members(raw, func(key []byte, quoted bool, member, value []byte) {
		var name string
		if err := json.Unmarshal([]byte(`"`+string(key)+`"`), &name); err != nil {
			t.Fatalf("Members(%q): key %q is no JSON string's contents: %v", raw, key, err)
		}
		if !quoted && name != string(key) {
			t.Fatalf("Members(%q): key %q reads as %q but is not marked quoted", raw, key, name)
		}
		if !bytes.HasPrefix(member, []byte(`"`+string(key)+`"`)) || !bytes.HasSuffix(member, value) {
			t.Fatalf("Members(%q): member %q is not key %q through value %q", raw, member, key, value)
		}
		got = append(got, [2]string{name, string(value)})
	})
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("Members(%q): %v; encoding/json: %v", raw, gerr, werr)
	}
	if gerr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("Members(%q)\n got %q\nwant %q", raw, got, want)
	}
}

// FuzzMembers holds Members, the walk of request bodies and chunks the
// rewrites use, to encoding/json.
func FuzzMembers(f *testing.F) {
	for _, tc := range typical {
		f.Add([]byte(tc.raw))
	}
	for _, tc := range quirks {
		f.Add([]byte(tc.raw))
	}
	for _, raw := range []string{
		" {\"a\" : 1, \"b\\u0062\":{\"c\":[1,{}]},\"é\":\"x\"\n} ", `{}`, ``, `null`, `[]`, `{"a":1,}`, `{"a":1}x`, `{"a":"\x01"}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"a":1,"a":2,"\ud800":3,"k\u212a":[]}`,
	} {
		f.Add([]byte(raw))
	}
	f.Fuzz(checkMembers)
}
