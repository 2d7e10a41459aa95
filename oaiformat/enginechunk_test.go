package oaiformat

import (
	"encoding/json"
	"testing"
)

// engineChatChunk is a chat chunk with one token.
const engineChatChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":null,"finish_reason":null}]}`

// engineVLLMChunk is a chat chunk as vLLM sends it (~200 bytes).
const engineVLLMChunk = `{"id":"chatcmpl-b7f0c1e6a2d84b1f9d3e5a7c","object":"chat.completion.chunk","created":1718000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":null,"finish_reason":null}]}`

// engineChunks are the chunk shapes engines send, with what the agent
// reads from each.
var engineChunks = []struct {
	name string
	raw  string
	want ChunkFields
}{
	{"chat", engineChatChunk, ChunkFields{Choices: 1, Text: " hi"}},
	{"chat vllm", engineVLLMChunk, ChunkFields{Choices: 1, Text: " hi"}},
	{"chat role first", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		ChunkFields{Choices: 1}},
	{"chat finish", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`,
		ChunkFields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{"chat finish length", `{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		ChunkFields{Choices: 1, HasFinish: true, FinishReason: "length"}},
	{"chat finish unusual", `{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"max_time"}]}`,
		ChunkFields{Choices: 1, HasFinish: true, FinishReason: "max_time"}},
	{"chat finish escaped", `{"choices":[{"delta":{},"finish_reason":"st\u006fp"}]}`,
		ChunkFields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{"completions", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hi","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
		ChunkFields{Choices: 1, Text: " hi"}},
	{"completions finish", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
		ChunkFields{Choices: 1, HasFinish: true, FinishReason: "length"}},
	{"usage only", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}`,
		ChunkFields{HasUsage: true, PromptTokens: 5, CompletionTokens: 16, TotalTokens: 21}},
	{"usage with details", `{"id":"c","choices":[],"usage":{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":null}}`,
		ChunkFields{HasUsage: true, PromptTokens: 5, CompletionTokens: 16, TotalTokens: 21}},
	{"continuous usage", `{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
		ChunkFields{Choices: 1, Text: "a", HasUsage: true, PromptTokens: 5, CompletionTokens: 1, TotalTokens: 6}},
	{"usage max", `{"usage":{"prompt_tokens":4294967295,"completion_tokens":0,"total_tokens":4294967295}}`,
		ChunkFields{HasUsage: true, PromptTokens: 4294967295, TotalTokens: 4294967295}},
	{"usage empty", `{"usage":{}}`, ChunkFields{HasUsage: true}},
	{"tool call delta", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},"logprobs":null,"finish_reason":null}]}`,
		ChunkFields{Choices: 1}},
	{"tool calls finish", `{"id":"c","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"}"}}]},"finish_reason":"tool_calls"}]}`,
		ChunkFields{Choices: 1, HasFinish: true, FinishReason: "tool_calls"}},
	{"reasoning", `{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":null},"finish_reason":null}]}`,
		ChunkFields{Choices: 1}},
	{"chat logprobs", `{"id":"c","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":{"content":[{"token":" hi","logprob":-0.0123,"bytes":[32,104,105],"top_logprobs":[{"token":" hi","logprob":-0.0123,"bytes":[32,104,105]},{"token":" hello","logprob":-4.5e-3,"bytes":null}]}]},"finish_reason":null}]}`,
		ChunkFields{Choices: 1, Text: " hi"}},
	{"completion logprobs", `{"id":"c","choices":[{"index":0,"text":" hi","logprobs":{"text_offset":[0],"token_logprobs":[-0.5],"tokens":[" hi"],"top_logprobs":[{" hi":-0.5,"Hi":-1.25E+0}]},"finish_reason":null}]}`,
		ChunkFields{Choices: 1, Text: " hi"}},
	{"unicode escapes", `{"choices":[{"delta":{"content":"caf\u00e9 \ud83d\ude00 \u4e2d\n\t\"\\\/"}}]}`,
		ChunkFields{Choices: 1, Text: "café 😀 中\n\t\"\\/"}},
	{"raw utf8", `{"choices":[{"delta":{"content":"café 😀 中文"}}]}`, ChunkFields{Choices: 1, Text: "café 😀 中文"}},
	{"lone surrogate", `{"choices":[{"delta":{"content":"a\ud800b\udc00c\ud800\u0041"}}]}`,
		ChunkFields{Choices: 1, Text: "a\uFFFDb\uFFFDc\uFFFDA"}},
	{"invalid utf8", "{\"choices\":[{\"delta\":{\"content\":\"a\xffb\xed\xa0\x80\"}}]}", ChunkFields{Choices: 1, Text: "a\uFFFDb\uFFFD\uFFFD\uFFFD"}},
	{"content and text", `{"choices":[{"text":"b","delta":{"content":"a"}}]}`, ChunkFields{Choices: 1, Text: "ab"}},
	{"n>1", `{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"},"finish_reason":"stop"}]}`,
		ChunkFields{Choices: 2, Text: "a"}},
	{"sglang", `{"id":"0b0b4c5e","object":"chat.completion.chunk","created":1718000000,"model":"default","choices":[{"index":0,"delta":{"role":null,"content":" hi","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`,
		ChunkFields{Choices: 1, Text: " hi"}},
	{"sglang finish", `{"id":"0b","object":"chat.completion.chunk","created":1,"model":"default","choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":128009}],"usage":null}`,
		ChunkFields{Choices: 1, HasFinish: true, FinishReason: "stop"}},
	{"openai spaced", "{\n  \"id\": \"chatcmpl-1\",\n  \"choices\": [ { \"index\": 0, \"delta\": { \"content\": \"x\" }, \"finish_reason\": null } ],\n  \"usage\": null\n}\n",
		ChunkFields{Choices: 1, Text: "x"}},
	{"null", `null`, ChunkFields{}},
	{"empty object", ` {} `, ChunkFields{}},
}

func TestReadChunk(t *testing.T) {
	for _, tc := range engineChunks {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadChunk([]byte(tc.raw))
			if err != nil {
				t.Fatalf("ReadChunk: %v", err)
			}
			if got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	for _, raw := range badChunks {
		if f, err := ReadChunk([]byte(raw)); err == nil {
			t.Errorf("ReadChunk(%q) = %+v, want an error", raw, f)
		}
	}
}

// readChunkUnmarshal is ReadChunk's contract: json.Unmarshal into a new
// engineChunk.
func readChunkUnmarshal(raw []byte) (ChunkFields, error) {
	var c engineChunk
	if err := json.Unmarshal(raw, &c); err != nil {
		return ChunkFields{}, err
	}
	return c.fields(), nil
}

// badChunks are chunks ReadChunk refuses.
var badChunks = []string{
	``, `{`, `{"choices":[{"delta":{"content":" hi"}}]}x`, `[]`, `"text"`,
	`{"choices":{}}`, `{"choices":[1]}`, `{"choices":[{"text":1}]}`, `{"choices":[{"finish_reason":1}]}`,
	`{"usage":{"prompt_tokens":-1}}`, `{"usage":{"completion_tokens":4294967296}}`, `{"usage":{"total_tokens":1.5}}`,
	`{} {}`, `{}]`, `null x`, `1`, ` `, "{}\n{\"choices\":[]}",
}

// One reader reads chunk after chunk, good and bad in every order, as
// json.Unmarshal reads each alone: nothing of one chunk (a longer choices
// array, a finish reason, usage, a refused chunk's bytes) shows in the next.
func TestChunkReaderKeepsNothingBetweenChunks(t *testing.T) {
	var all []string
	for _, tc := range engineChunks {
		all = append(all, tc.raw)
	}
	all = append(all, badChunks...)
	var r chunkReader
	for _, a := range all {
		for _, b := range all {
			for _, raw := range []string{a, b} {
				checkChunkReader(t, &r, []byte(raw))
			}
		}
	}
}

func checkChunkReader(t *testing.T, r *chunkReader, raw []byte) {
	t.Helper()
	got, err := r.readChunk(raw)
	want, werr := readChunkUnmarshal(raw)
	if got != want || (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("ReadChunk(%q) = %+v, %v; json.Unmarshal reads %+v, %v", raw, got, err, want, werr)
	}
}

// FuzzReadChunk holds a reader that has read one chunk to json.Unmarshal
// on the next.
func FuzzReadChunk(f *testing.F) {
	for _, tc := range engineChunks {
		f.Add([]byte(engineChatChunk), []byte(tc.raw))
	}
	for _, raw := range badChunks {
		f.Add([]byte(raw), []byte(engineChatChunk))
	}
	f.Fuzz(func(t *testing.T, first, second []byte) {
		var r chunkReader
		checkChunkReader(t, &r, first)
		checkChunkReader(t, &r, second)
		checkChunkReader(t, &r, first)
	})
}

func BenchmarkReadChunk(b *testing.B) {
	raw := []byte(engineVLLMChunk)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ReadChunk(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadChunkUnmarshal(b *testing.B) {
	raw := []byte(engineVLLMChunk)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := readChunkUnmarshal(raw); err != nil {
			b.Fatal(err)
		}
	}
}
