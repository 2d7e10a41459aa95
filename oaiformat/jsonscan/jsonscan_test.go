package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

const chatChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":null,"finish_reason":null}]}`

// benchChunk is a chat chunk as vLLM sends it (~200 bytes).
const benchChunk = `{"id":"chatcmpl-b7f0c1e6a2d84b1f9d3e5a7c","object":"chat.completion.chunk","created":1718000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":null,"finish_reason":null}]}`

// typical are the chunk shapes engines send: seeds of FuzzMembers.
var typical = []struct {
	name string
	raw  string
}{
	{"chat", chatChunk},
	{"chat vllm", benchChunk},
	{"chat role first", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`},
	{"chat finish", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`},
	{"chat finish length", `{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`},
	{"chat finish unusual", `{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"max_time"}]}`},
	{"chat finish escaped", `{"choices":[{"delta":{},"finish_reason":"st\u006fp"}]}`},
	{"completions", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hi","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`},
	{"completions finish", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`},
	{"usage only", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}`},
	{"usage with details", `{"id":"c","choices":[],"usage":{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":null}}`},
	{"continuous usage", `{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`},
	{"usage max", `{"usage":{"prompt_tokens":4294967295,"completion_tokens":0,"total_tokens":4294967295}}`},
	{"usage empty", `{"usage":{}}`},
	{"tool call delta", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},"logprobs":null,"finish_reason":null}]}`},
	{"tool calls finish", `{"id":"c","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"}"}}]},"finish_reason":"tool_calls"}]}`},
	{"reasoning", `{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":null},"finish_reason":null}]}`},
	{"chat logprobs", `{"id":"c","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":{"content":[{"token":" hi","logprob":-0.0123,"bytes":[32,104,105],"top_logprobs":[{"token":" hi","logprob":-0.0123,"bytes":[32,104,105]},{"token":" hello","logprob":-4.5e-3,"bytes":null}]}]},"finish_reason":null}]}`},
	{"completion logprobs", `{"id":"c","choices":[{"index":0,"text":" hi","logprobs":{"text_offset":[0],"token_logprobs":[-0.5],"tokens":[" hi"],"top_logprobs":[{" hi":-0.5,"Hi":-1.25E+0}]},"finish_reason":null}]}`},
	{"unicode escapes", `{"choices":[{"delta":{"content":"caf\u00e9 \ud83d\ude00 \u4e2d\n\t\"\\\/"}}]}`},
	{"raw utf8", `{"choices":[{"delta":{"content":"café 😀 中文"}}]}`},
	{"lone surrogate", `{"choices":[{"delta":{"content":"a\ud800b\udc00c\ud800\u0041"}}]}`},
	{"invalid utf8", "{\"choices\":[{\"delta\":{\"content\":\"a\xffb\xed\xa0\x80\"}}]}"},
	{"content and text", `{"choices":[{"text":"b","delta":{"content":"a"}}]}`},
	{"n>1", `{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"},"finish_reason":"stop"}]}`},
	{"sglang", `{"id":"0b0b4c5e","object":"chat.completion.chunk","created":1718000000,"model":"default","choices":[{"index":0,"delta":{"role":null,"content":" hi","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`},
	{"sglang finish", `{"id":"0b","object":"chat.completion.chunk","created":1,"model":"default","choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":128009}],"usage":null}`},
	{"openai spaced", "{\n  \"id\": \"chatcmpl-1\",\n  \"choices\": [ { \"index\": 0, \"delta\": { \"content\": \"x\" }, \"finish_reason\": null } ],\n  \"usage\": null\n}\n"},
	{"null", `null`},
	{"empty object", ` {} `},
}

// quirks are documents where encoding/json does something surprising:
// seeds of FuzzMembers.
var quirks = []struct {
	raw string
}{
	// Whole-document validation.
	{``},
	{` `},
	{`{}x`},
	{`{} {}`},
	{"\t\r\n {} \t\r\n"},
	{`{"id":1,}`},
	{`{"id":01}`},
	{`{"id":-}`},
	{`{"id":1.}`},
	{`{"id":1e}`},
	{`{"id":.5}`},
	{`{"id":+1}`},
	{`{"id":-0.0e-0}`},
	{`{"id":tru}`},
	{`{"id":nul}`},
	{`{"id":NaN}`},
	{`{"id":"a` + "\x01" + `"}`},
	{`{"id":"\x"}`},
	{`{"id":"\'"}`},
	{`{"id":"\u12"}`},
	{`{"id":"\u12g4"}`},
	{"{\"id\":\"\x7f\"}"},
	{"\xef\xbb\xbf{}"},
	{`{"id":[1,2,]}`},
	{`{"id":[1 2]}`},
	{`{"id":{"a" 1}}`},
	{`{"id":{"a":1 "b":2}}`},
	{`{'id':1}`},
	{`{"choices":[]`},
	{`{"choices":[{"text":"a"}]}]`},
	// Top-level values other than objects.
	{`null`},
	{` null `},
	{`nul`},
	{`[]`},
	{`"x"`},
	{`1`},
	{`true`},
	// Key matching.
	{`{"CHOICES":[{"TEXT":"a","DELTA":{"CONTENT":"b"},"FINISH_REASON":"x"}],"USAGE":{"PROMPT_TOKENS":1,"Completion_Tokens":2,"total_TOKENS":3}}`},
	{`{"\u0063hoices":[{"t\u0065xt":"a"}]}`},
	{`{"choice\u017f":[{"text":"a"}]}`},       // LATIN SMALL LETTER LONG S folds to 's'
	{"{\"choice\u017f\":[{\"text\":\"a\"}]}"}, // the same, raw
	{`{"usage":{"prompt_to\u212aens":7}}`},    // KELVIN SIGN folds to 'k'
	{"{\"usage\":{\"total_to\u212aens\":7}}"},
	{`{"choices ":[{"text":"a"}]}`},
	{`{"choice":[{"text":"a"}]}`},
	{`{"finish_reason":"stop","text":"a","content":"b","prompt_tokens":1}`},
	{"{\"choices\xff\":1}"},
	{`{"choices\u0000":1}`},
	{`{"finish` + "\u0130" + `reason":1}`},
	{`{"choices":[{"finish_reaſon":"stop"}]}`},
	{`{"choices":[{"finish\u005freason":"stop"}]}`},
	{"{\"choices\":[{\"finish\x7freason\":\"stop\"}]}"},
	// Duplicate keys: last wins, objects merge.
	{`{"choices":[{"text":"a"}],"choices":[{"text":"b"},{}]}`},
	{`{"choices":[{"text":"a"}],"choices":[{}]}`},
	{`{"choices":[{"text":"a"},{}],"choices":[null]}`},
	{`{"choices":[{"text":"a"}],"choices":[]}`},
	{`{"choices":[{"text":"a"}],"choices":[],"choices":[{}]}`},
	{`{"choices":[{"text":"a"}],"choices":null,"choices":[{}]}`},
	{`{"choices":[{"text":"a","finish_reason":"stop"}],"choices":[{"delta":{"content":"b"}}]}`},
	{`{"choices":[{"text":"a","text":"b"}]}`},
	{`{"choices":[{"text":"a","text":null}]}`},
	{`{"choices":[{"delta":{"content":"a"},"delta":{"role":"x"}}]}`},
	{`{"choices":[{"delta":{"content":"a","content":"b"}}]}`},
	{`{"choices":[{"delta":{"content":"a"},"delta":null}]}`},
	{`{"choices":[{"finish_reason":"stop","finish_reason":null}]}`},
	{`{"choices":[{"finish_reason":null,"finish_reason":"length"}]}`},
	{`{"usage":{"prompt_tokens":1},"usage":{"total_tokens":3}}`},
	{`{"usage":{"prompt_tokens":1},"usage":null}`},
	{`{"usage":{"prompt_tokens":1},"usage":null,"usage":{"total_tokens":3}}`},
	{`{"usage":{"prompt_tokens":1,"prompt_tokens":null}}`},
	{`{"usage":{"prompt_tokens":1,"prompt_tokens":2}}`},
	{`{"choices":null}`},
	{`{"choices":[null]}`},
	{`{"choices":[null,null,{}]}`},
	{`{"choices":[{"text":null,"delta":null,"finish_reason":null}]}`},
	{`{"usage":null}`},
	// Type mismatches, in any element.
	{`{"choices":{}}`},
	{`{"choices":"x"}`},
	{`{"choices":1}`},
	{`{"choices":true}`},
	{`{"choices":[1]}`},
	{`{"choices":["x"]}`},
	{`{"choices":[[]]}`},
	{`{"choices":[false]}`},
	{`{"choices":[{},1]}`},
	{`{"choices":[{},{"text":5}]}`},
	{`{"choices":[{},{"delta":{"content":true}}]}`},
	{`{"choices":[{},{"finish_reason":1}]}`},
	{`{"choices":[{"text":5}]}`},
	{`{"choices":[{"text":true}]}`},
	{`{"choices":[{"text":{}}]}`},
	{`{"choices":[{"text":[]}]}`},
	{`{"choices":[{"delta":"x"}]}`},
	{`{"choices":[{"delta":[]}]}`},
	{`{"choices":[{"delta":1}]}`},
	{`{"choices":[{"delta":{"content":1}}]}`},
	{`{"choices":[{"delta":{"content":{}}}]}`},
	{`{"choices":[{"finish_reason":1}]}`},
	{`{"choices":[{"finish_reason":false}]}`},
	{`{"choices":[{"finish_reason":{}}]}`},
	{`{"choices":[{"finish_reason":["stop"]}]}`},
	{`{"usage":1}`},
	{`{"usage":"x"}`},
	{`{"usage":[]}`},
	{`{"usage":true}`},
	{`{"usage":{"prompt_tokens":1.5}}`},
	{`{"usage":{"prompt_tokens":1.0}}`},
	{`{"usage":{"prompt_tokens":-1}}`},
	{`{"usage":{"prompt_tokens":-0}}`},
	{`{"usage":{"prompt_tokens":1e2}}`},
	{`{"usage":{"prompt_tokens":1E2}}`},
	{`{"usage":{"prompt_tokens":4294967296}}`},
	{`{"usage":{"prompt_tokens":18446744073709551616}}`},
	{`{"usage":{"prompt_tokens":"1"}}`},
	{`{"usage":{"prompt_tokens":true}}`},
	{`{"usage":{"prompt_tokens":{}}}`},
	{`{"usage":{"prompt_tokens":[]}}`},
	{`{"usage":{"prompt_tokens":01}}`},
	{`{"usage":{"prompt_tokens":0}}`},
	{`{"usage":{"prompt_tokens":0000}}`},
	{`{"usage":{"prompt_tokens":00000000000000000000001}}`},
	{`{"usage":{"prompt_tokens":1},"choices":[{"text":1}]}`},
	// Unknown values are validated but may hold anything.
	{`{"id":{"choices":1,"usage":"x"},"x":[{"text":1}],"y":[true,false,null,-1.5e+3,"\u00e9",{}]}`},
	{`{"choices":[{"logprobs":{"text":1,"delta":[]},"delta":{"x":{"content":1}}}]}`},
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
