package openaihttp

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

func assembled(t *testing.T, kind apiKind, finish string, events ...*wire.Event) string {
	t.Helper()
	a := &assembler{chat: kind.api == wire.API_API_CHAT}
	for _, ev := range events {
		a.add(ev)
	}
	out, err := json.Marshal(a.response(kind, finish, usage{1, 2, 3}))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func raw(s string) *wire.Event { return &wire.Event{Raw: []byte(s)} }

func TestAssemblerEdges(t *testing.T) {
	const u = `"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}`
	for _, tc := range []struct {
		name   string
		kind   apiKind
		finish string
		events []*wire.Event
		want   string
	}{{
		name: "an event that is not an OpenAI chunk adds the agent's text",
		kind: chatAPI, finish: "length",
		events: []*wire.Event{
			raw(`{"id":"x","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}`),
			{Raw: []byte(`{"choices":[{"index":"zero","delta":{"content":"b"}}]}`), DeltaText: "b"},
			raw(`{"id":"x","choices":[{"index":0,"delta":{"content":"c"}}]}`),
		},
		want: `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"abc"},"logprobs":null,"finish_reason":"length"}],` + u + `}`,
	}, {
		name: "an engine that ignored stream=true sent one whole answer",
		kind: chatAPI,
		events: []*wire.Event{raw(`{"id":"w","object":"chat.completion","created":2,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,` +
			`"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"[]"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5}}`)},
		want: `{"id":"w","object":"chat.completion","created":2,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[` +
			`{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"[]"}}]},"logprobs":null,"finish_reason":"tool_calls"}],` + u + `}`,
	}, {
		name: "tool call deltas without an index are one call each; refusal, reasoning and extra members kept",
		kind: chatAPI, finish: "stop",
		events: []*wire.Event{
			raw(`{"id":"r","created":3,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","refusal":"I can","reasoning":"hm","x_vendor":1}}]}`),
			raw(`{"id":"r","choices":[{"index":0,"delta":{"refusal":"not.","x_vendor":2,"tool_calls":[{"id":"t1","function":{"name":"f","arguments":"1"}}]}}]}`),
			raw(`{"id":"r","choices":[{"index":0,"delta":{"tool_calls":[{"id":"t2","function":{"name":"g","arguments":"2"}}]}}]}`),
		},
		want: `{"id":"r","object":"chat.completion","created":3,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I cannot.","reasoning":"hm","tool_calls":[` +
			`{"id":"t1","type":"function","function":{"name":"f","arguments":"1"}},{"id":"t2","type":"function","function":{"name":"g","arguments":"2"}}],"x_vendor":2},"logprobs":null,"finish_reason":"stop"}],` + u + `}`,
	}, {
		name: "no events at all: one empty choice",
		kind: completionAPI, finish: "stop",
		want: `{"id":"","object":"text_completion","created":0,"model":"","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop"}],` + u + `}`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := assembled(t, tc.kind, tc.finish, tc.events...); got != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// FuzzAssembler: whatever an engine sends, assembling never panics and the
// answer is valid JSON.
func FuzzAssembler(f *testing.F) {
	f.Add([]byte(`{"id":"x","choices":[{"index":0,"delta":{"content":"a","tool_calls":[{"index":0,"function":{"arguments":"{"}}]},"logprobs":{"content":[1]}}]}`), "a")
	f.Add([]byte(`{"choices":[{"index":1,"text":"t","logprobs":{"tokens":["t"],"x":1}},{"index":1,"message":{"content":"m"}}],"system_fingerprint":null}`), "t")
	f.Add([]byte(`{"choices":[{"index":0,"delta":null,"logprobs":null}],"a\u0062":{}}`), "")
	f.Add([]byte(`null`), "z")
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		for _, kind := range []apiKind{chatAPI, completionAPI} {
			a := &assembler{chat: kind.api == wire.API_API_CHAT}
			a.add(&wire.Event{Raw: data, DeltaText: text})
			a.add(&wire.Event{Raw: data, DeltaText: text})
			out, err := json.Marshal(a.response(kind, "stop", usage{}))
			if err != nil {
				t.Fatalf("%s: %v", data, err)
			}
			if !json.Valid(out) {
				t.Fatalf("%s: invalid output %s", data, out)
			}
		}
	})
}

// toolEvent is a chat chunk opening tool calls from..to-1 of choice.
func toolEvent(choice, from, to int) *wire.Event {
	b := []byte(`{"id":"t","choices":[{"index":` + strconv.Itoa(choice) + `,"delta":{"tool_calls":[`)
	for i := from; i < to; i++ {
		if i > from {
			b = append(b, ',')
		}
		b = append(b, `{"index":`+strconv.Itoa(i)+`,"id":"c","function":{"name":"f","arguments":"x"}}`...)
	}
	return &wire.Event{Raw: append(b, `]}}]}`...)}
}

// TestAssemblerBounds: choices and tool calls are found by index in one
// lookup, and an answer with more of them than an answer holds is refused
// with errTooManyParts instead of growing.
func TestAssemblerBounds(t *testing.T) {
	a := &assembler{chat: true}
	// Every tool index, met again in each event: each costs a lookup.
	const per = maxToolCalls / 8
	for ev := range 8 {
		for range 2 {
			if err := a.add(toolEvent(0, ev*per, (ev+1)*per)); err != nil {
				t.Fatalf("event %d: %v", ev, err)
			}
		}
	}
	if n := len(a.choices[0].tools); n != maxToolCalls {
		t.Fatalf("%d tool calls, want %d", n, maxToolCalls)
	}
	if args := a.choices[0].toolIndex[7].args.String(); args != "xx" {
		t.Fatalf("tool 7's arguments %q, want both pieces", args)
	}
	if err := a.add(toolEvent(0, maxToolCalls, maxToolCalls+1)); !errors.Is(err, errTooManyParts) {
		t.Fatalf("tool call past the bound: %v", err)
	}

	a = &assembler{chat: true}
	for i := range maxChoices {
		if err := a.add(raw(`{"choices":[{"index":` + strconv.Itoa(i*7) + `,"delta":{"content":"a"}}]}`)); err != nil {
			t.Fatalf("choice %d: %v", i, err)
		}
	}
	if err := a.add(raw(`{"choices":[{"index":-1,"delta":{"content":"a"}}]}`)); !errors.Is(err, errTooManyParts) {
		t.Fatalf("choice past the bound: %v", err)
	}
	if err := a.add(raw(`{"choices":[{"index":7,"delta":{"content":"b"}}]}`)); err != nil {
		t.Fatalf("a known choice: %v", err)
	}
	if got := a.byIndex[7].content.String(); got != "ab" {
		t.Fatalf("choice 7: %q", got)
	}
}
