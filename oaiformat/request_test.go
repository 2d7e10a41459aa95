package oaiformat

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

var parseCases = []struct {
	name   string
	api    wire.API
	body   string
	code   string // "" means valid
	stream bool
	noPD   bool
}{
	{"chat", wire.API_API_CHAT, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "", false, false},
	{"chat stream usage", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`, "", true, false},
	{"parts content", wire.API_API_CHAT, `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, "", false, false},
	{"n two needs regular", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"n":2}`, "", false, true},
	{"completion", wire.API_API_COMPLETION, `{"prompt":"once"}`, "", false, false},
	{"completion array", wire.API_API_COMPLETION, `{"prompt":["once"]}`, "", false, false},
	{"usage without stream", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, "invalid_value", false, false},
	{"bad json", wire.API_API_CHAT, `{`, "invalid_json", false, false},
	{"trailing", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}]}x`, "invalid_json", false, false},
	{"array body", wire.API_API_CHAT, `[]`, "invalid_type", false, false},
	{"model number", wire.API_API_CHAT, `{"model":3,"messages":[{"role":"user","content":"hi"}]}`, "invalid_type", false, false},
	{"long model", wire.API_API_CHAT, `{"model":"` + strings.Repeat("m", 300) + `","messages":[{"role":"user","content":"hi"}]}`, "invalid_value", false, false},
	{"empty messages", wire.API_API_CHAT, `{"messages":[]}`, "invalid_value", false, false},
	{"no role", wire.API_API_CHAT, `{"messages":[{"content":"hi"}]}`, "invalid_value", false, false},
	{"max tokens zero", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, "invalid_value", false, false},
	{"temperature", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"temperature":3}`, "invalid_value", false, false},
	{"top_p", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"top_p":0}`, "invalid_value", false, false},
	{"too many stops", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}`, "invalid_value", false, false},
	{"stop number", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"stop":1}`, "invalid_type", false, false},
	{"prompt number", wire.API_API_COMPLETION, `{"prompt":1}`, "invalid_type", false, false},
	{"no prompt", wire.API_API_COMPLETION, `{}`, "invalid_value", false, false},
	{"kv_transfer_params", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.9"}}`, "reserved_field", false, false},
	{"kv_transfer_params null", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":null}`, "reserved_field", false, false},
	{"bootstrap_host", wire.API_API_COMPLETION, `{"prompt":"x","bootstrap_host":"10.0.0.9"}`, "reserved_field", false, false},
	{"bootstrap_port", wire.API_API_COMPLETION, `{"prompt":"x","bootstrap_port":8998}`, "reserved_field", false, false},
	{"bootstrap_room", wire.API_API_COMPLETION, `{"prompt":"x","bootstrap_room":7}`, "reserved_field", false, false},
	{"bootstrap_pair_key", wire.API_API_COMPLETION, `{"prompt":"x","bootstrap_pair_key":"k"}`, "reserved_field", false, false},
	{"escaped hand-off key", wire.API_API_COMPLETION, `{"prompt":"x","kv_transfer_p\u0061rams":{}}`, "reserved_field", false, false},
	{"invalid utf8", wire.API_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", "invalid_encoding", false, false},
}

func TestParseRequest(t *testing.T) {
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Read(tc.api, []byte(tc.body))
			if tc.code != "" {
				var e *Error
				if !errors.As(err, &e) || e.Code != tc.code {
					t.Fatalf("got %v, want code %s", err, tc.code)
				}
				if e.Code == "reserved_field" && (e.Param == "" || !strings.Contains(e.Message, e.Param)) {
					t.Fatalf("refusal %+v does not name the field", e)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if p.Stream != tc.stream || (p.NoPD != "") != tc.noPD {
				t.Fatalf("parsed %+v", p)
			}
		})
	}
}

// FuzzRead: no body crashes the reader, every refusal is an *Error with a
// code, an accepted body is one encoding/json accepts, with a sane model
// and n, and no accepted body carries a hand-off field as an engine reads
// keys.
func FuzzRead(f *testing.F) {
	for _, tc := range parseCases {
		f.Add(uint8(tc.api), []byte(tc.body))
	}
	for _, body := range readSeeds {
		f.Add(uint8(wire.API_API_CHAT), []byte(body))
		f.Add(uint8(wire.API_API_COMPLETION), []byte(body))
	}
	f.Fuzz(func(t *testing.T, api uint8, body []byte) {
		a := wire.API_API_CHAT
		if api%2 == 1 {
			a = wire.API_API_COMPLETION
		}
		p, err := Read(a, body)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == "" || e.Message == "" {
				t.Fatalf("rejection %v", err)
			}
			return
		}
		if len(p.Model) > MaxModelLen || p.N < 1 || p.N > MaxN {
			t.Fatalf("accepted %+v", p)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", body, err)
		}
		for _, k := range HandoffFields {
			if _, ok := m[k]; ok {
				t.Fatalf("accepted %q with %s", body, k)
			}
		}
	})
}

// readSeeds are bodies for FuzzRead and the tests below, as clients send
// them and a few stranger ones.
var readSeeds = []string{
	benchChat,
	benchPrompt16,
	`{"model":"sim-model","prompt":"alpha bravo charlie","max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`,
	`{"model":"m","prompt":["one prompt"],"stop":["\n\n","END"],"temperature":0.7,"top_p":0.95,"n":2,"max_tokens":16}`,
	`{"model":"m","prompt":[[1,2,3]],"max_tokens":9007199254740993}`,
	`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"hi \u00e9\ud83d\ude00"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"stream":true}`,
	`{"model":"m","messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}],"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"tool_choice":"auto"}`,
	`{"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f","parameters":{}}],"function_call":"auto"}`,
	`{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":100,"stop":"\n","temperature":0,"top_p":1,"seed":-1,"logit_bias":{"50256":-100}}`,
	`{"messages":[{"role":"developer","content":"d"},{"role":"user","content":"u","name":"n"}],"response_format":{"type":"json_object"},"logprobs":true,"top_logprobs":5}`,
	` {"messages" : [ { "role" : "user" , "content" : "spaced" } ] , "stream" : false } ` + "\n",
	`{"m\u006fdel":"m\u00e9","messages":[{"r\u006fle":"\u0075ser","content":"escaped keys"}]}`,
	`{"model":null,"stream":null,"stream_options":null,"max_tokens":null,"n":null,"temperature":null,"top_p":null,"stop":null,"tools":null,"functions":null,"messages":[{"role":"user","content":"nulls"}],"prompt":null}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":1.0}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":1e2}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":-0}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":9223372036854775807,"n":-9223372036854775808}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":9223372036854775808}`,
	`{"messages":[{"role":"user","content":"x"}],"temperature":1e400}`,
	`{"messages":[{"role":"user","content":"x"}],"temperature":1e-400,"top_p":0.5E+0}`,
	`{"messages":[{"role":"user","content":"x"}],"n":true}`,
	`{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1},"stream":true}`,
	`{"messages":[{"role":"user","content":"x"}],"stream_options":[],"stream":true}`,
	`{"messages":{"role":"user"}}`,
	`{"messages":["user"]}`,
	`{"messages":[{"role":["user"]}]}`,
	`{"messages":[null]}`,
	`{"messages":[{"role":"user","content":"x"}],"model":1,"stream":"x"}`,
	`{"messages":[{"role":"user","content":"x"}],"model":1,"stream":"x"`,
	`{"messages":[{"role":"user","content":"x"}],"model":1} x`,
	`{"messages":[{"role":"user","content":"x"}],"stop":["a",null,""]}`,
	`{"messages":[{"role":"user","content":"x"}],"stop":["a",1]}`,
	`{"model":"a","model":"b","messages":[{"role":"user","content":"x"}],"max_tokens":0,"max_tokens":5}`,
	`{"messages":[{"role":"user","content":"x"}],"messages":[{"content":"y"}]}`,
	`{"messages":[{"role":"a","content":1},{"role":"b"},{"role":"c"}],"messages":[{"content":2}],"messages":[{},{},{},{}]}`,
	`{"messages":[{"role":"a"}],"messages":[null]}`,
	`{"messages":[{"role":"a"}],"messages":[],"messages":[{}]}`,
	`{"messages":[{"role":"a"}],"messages":null,"messages":[{}]}`,
	`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{},"messages":[{"role":"user"}]}`,
	`{"stream_options":{"include_usage":true},"stream_options":null,"messages":[{"role":"user"}]}`,
	`null`, `"x"`, `12`, `[]`, `{}`, ``, ` `, `{"a":1}{}`, `{"a":[1,2,{"b":null}],"c":"\ud800"}`,
	`{"prompt":"x","kv_transfer_params":null}`, `{"prompt":"x","disagg_prefill_dp_rank":0,"decode_tp_size":1}`,
}

// TestNoMigration: streams a continuation cannot resume are marked.
func TestNoMigration(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for body, want := range map[string]string{
		`{` + msgs + `}`:              "",
		`{` + msgs + `,"n":1}`:        "",
		`{` + msgs + `,"n":2}`:        "n > 1",
		`{` + msgs + `,"tools":null}`: "",
		`{` + msgs + `,"tools":[ ]}`:  "",
		`{` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}]}`: "tools",
		`{` + msgs + `,"functions":[{"name":"f"}]}`:                            "tools",
	} {
		p, err := Read(wire.API_API_CHAT, []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if p.NoMigration != want {
			t.Errorf("%s: NoMigration %q, want %q", body, p.NoMigration, want)
		}
	}
}

// TestReadCaseSensitive: Read matches member names exactly, as vLLM and
// SGLang do, where encoding/json would read "MODEL" as the model: a
// member spelled so is someone else's member, passed through and never
// checked.
func TestReadCaseSensitive(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		body string
		code string // Read's refusal, "" if it accepts
	}{
		{`{"MODEL":"big",` + msgs + `}`, ""},
		{`{"Model":3,` + msgs + `}`, ""},
		{`{"Max_Tokens":0,` + msgs + `}`, ""},
		{`{"max_to\u212Aens":0,` + msgs + `}`, ""}, // KELVIN SIGN folds to k
		{`{"max_token\u017F":0,` + msgs + `}`, ""}, // LONG S folds to s
		{`{"KV_TRANSFER_PARAMS":{},` + msgs + `}`, ""},
		{`{"Stream_Options":{"include_usage":true},` + msgs + `}`, ""},
		{`{"stream":true,"stream_options":{"Include_Usage":"x"},` + msgs + `}`, ""},
		{`{"messages":[{"ROLE":"user","content":"x"}]}`, "invalid_value"},
		{`{"\u0073tream":"x",` + msgs + `}`, "invalid_type"}, // an escape, not a case variant
	} {
		body := []byte(tc.body)
		p, err := Read(wire.API_API_CHAT, body)
		var e *Error
		switch {
		case tc.code == "" && err != nil, tc.code != "" && (!errors.As(err, &e) || e.Code != tc.code):
			t.Errorf("%s: Read %v, want code %q", body, err, tc.code)
		case err == nil && p.Model != "":
			t.Errorf("%s: Read model %q, want none", body, p.Model)
		}
	}
}

// TestReadDuplicates: a duplicate member's last value wins, as with
// encoding/json and Python's json; like encoding/json (unlike Python's
// json, which replaces the value), a repeated stream_options or messages
// decodes into what the earlier one left.
func TestReadDuplicates(t *testing.T) {
	for _, tc := range []struct {
		body         string
		code         string
		model        string
		includeUsage bool
		roles        []string
		contents     []string
	}{
		{`{"model":"a","model":"b","messages":[{"role":"user"}]}`, "", "b", false, []string{"user"}, []string{""}},
		{`{"model":"a","model":null,"messages":[{"role":"user"}]}`, "", "", false, []string{"user"}, []string{""}},
		{`{"max_tokens":0,"max_tokens":5,"messages":[{"role":"user"}]}`, "", "", false, []string{"user"}, []string{""}},
		{`{"max_tokens":5,"max_tokens":0,"messages":[{"role":"user"}]}`, "invalid_value", "", false, nil, nil},
		{`{"messages":[{"role":"user","role":"system","content":"a","content":"b"}]}`, "", "", false, []string{"system"}, []string{`"b"`}},
		{`{"messages":[{"role":"user","content":"x"}],"messages":[{"content":"y"}]}`, "", "", false, []string{"user"}, []string{`"y"`}},
		{`{"messages":[{"role":"a","content":1},{"role":"b"},{"role":"c"}],"messages":[{"content":2}],"messages":[{},{},{},{}]}`,
			"invalid_value", "", false, nil, nil}, // the fourth element is new: no role
		{`{"messages":[{"role":"a","content":1},{"role":"b"},{"role":"c"}],"messages":[{"content":2}],"messages":[{},{},{}]}`,
			"", "", false, []string{"a", "b", "c"}, []string{"2", "", ""}},
		{`{"messages":[{"role":"a"}],"messages":[null]}`, "", "", false, []string{"a"}, []string{""}},
		{`{"messages":[{"role":"a"}],"messages":[],"messages":[{}]}`, "invalid_value", "", false, nil, nil},
		{`{"messages":[{"role":"a"}],"messages":null,"messages":[{}]}`, "invalid_value", "", false, nil, nil},
		{`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{},"messages":[{"role":"u"}]}`, "", "", true, []string{"u"}, []string{""}},
		{`{"stream":true,"stream_options":{"include_usage":true},"stream_options":null,"stream_options":{},"messages":[{"role":"u"}]}`, "", "", false, []string{"u"}, []string{""}},
	} {
		body := []byte(tc.body)
		p, err := Read(wire.API_API_CHAT, body)
		var e *Error
		switch {
		case tc.code != "":
			if !errors.As(err, &e) || e.Code != tc.code {
				t.Errorf("%s: %v, want code %s", body, err, tc.code)
			}
			continue
		case err != nil:
			t.Errorf("%s: %v", body, err)
			continue
		}
		if p.Model != tc.model || p.IncludeUsage != tc.includeUsage || len(p.messages) != len(tc.roles) {
			t.Errorf("%s: %+v", body, p)
			continue
		}
		for i, m := range p.messages {
			if m.Role != tc.roles[i] || string(m.Content) != tc.contents[i] {
				t.Errorf("%s: message %d %q %q, want %q %q", body, i, m.Role, m.Content, tc.roles[i], tc.contents[i])
			}
		}
	}
}

// TestReadErrors: refusals say what is wrong and where.
func TestReadErrors(t *testing.T) {
	for body, want := range map[string]struct{ code, param, msg string }{
		`{`:                  {"invalid_json", "", "unexpected end of JSON input at offset 1"},
		``:                   {"invalid_json", "", "unexpected end of JSON input at offset 0"},
		`{"model":x}`:        {"invalid_json", "", "invalid character 'x' looking for beginning of value at offset 9"},
		`{"model":"m"} {}`:   {"invalid_json", "", "data after the JSON object, at offset 14"},
		`[1]`:                {"invalid_type", "", "request body: expected object, got JSON array"},
		`{"max_tokens":"1"}`: {"invalid_type", "max_tokens", "max_tokens: expected int64, got JSON string"},
		`{"max_tokens":1.5}`: {"invalid_type", "max_tokens", "max_tokens: expected int64, got JSON number 1.5"},
		`{"stream_options":{"include_usage":"yes"}}`: {"invalid_type", "stream_options.include_usage", "got JSON string"},
		`{"messages":[{"role":1}]}`:                  {"invalid_type", "messages.role", "messages.role: expected string, got JSON number"},
		`{"messages":[{"role":1}],"model":2}`:        {"invalid_type", "messages.role", "messages.role"},
		`{"messages":[{"role":1}],"model":2,}`:       {"invalid_json", "", "offset 35"},
	} {
		_, err := Read(wire.API_API_CHAT, []byte(body))
		var e *Error
		if !errors.As(err, &e) || e.Code != want.code || e.Param != want.param || !strings.Contains(e.Message, want.msg) {
			t.Errorf("%s: %#v, want %+v", body, err, want)
		}
	}
}

// TestReadDepth: encoding/json's limit of 10000 nested arrays and objects,
// counted from the body's object, in a message's content and in a member
// Read skips.
func TestReadDepth(t *testing.T) {
	nest := func(k int) string { return strings.Repeat("[", k) + strings.Repeat("]", k) }
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"messages":[{"role":"user","content":` + nest(9997) + `}]}`, true},
		{`{"messages":[{"role":"user","content":` + nest(9998) + `}]}`, false},
		{`{"messages":[{"role":"user","content":"x"}],"x":` + nest(9999) + `}`, true},
		{`{"messages":[{"role":"user","content":"x"}],"x":` + nest(10000) + `}`, false},
		{`{"messages":[{"role":"user","content":"x"}],"stream_options":{"x":` + nest(9998) + `}}`, true},
		{`{"messages":[{"role":"user","content":"x"}],"stream_options":{"x":` + nest(9999) + `}}`, false},
	} {
		_, err := Read(wire.API_API_CHAT, []byte(tc.body))
		if (err == nil) != tc.ok {
			t.Errorf("%.60s...: %v", tc.body, err)
		}
	}
}

// The bodies BenchmarkRead reads: a chat of about 1.1 kB (a system and a
// user message, stream, max_tokens, temperature), and the loadgen's body
// with a 16-word prompt.
const (
	benchChat = `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[` +
		`{"role":"system","content":"You are a careful assistant for a logistics company. Answer questions about shipments, ` +
		`routes and delivery windows using only the facts given in the conversation. When a fact is missing, say so plainly ` +
		`and suggest which document or team could supply it. Keep answers short: two or three sentences unless the user ` +
		`asks for detail. Quote tracking numbers exactly as given, never reformat dates, and give weights in kilograms ` +
		`with one decimal place. Do not speculate about customs delays or weather."},` +
		`{"role":"user","content":"Shipment 4471-AX left the Rotterdam depot on 12 March at 06:40 with 18 pallets, ` +
		`14.2 tonnes in total, bound for the Lyon cross-dock. The driver reported a 90 minute stop at the Belgian border ` +
		`for a document check and a second stop near Metz to swap trailers. The Lyon team expects it before their 17:00 ` +
		`cut-off, but the carrier's portal still shows the old trailer id. Which trailer id should the Lyon team use ` +
		`when they book the unloading slot, and is the 17:00 cut-off still realistic given the two stops?"}],` +
		`"stream":true,"max_tokens":256,"temperature":0.7}`
	benchPrompt16 = `{"model":"sim-model","messages":[{"role":"user","content":"alpha bravo charlie delta echo foxtrot golf hotel ` +
		`india juliet kilo lima mike november oscar papa"}],"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`
)

// BenchmarkRead measures Read on a typical chat body and on the loadgen's.
func BenchmarkRead(b *testing.B) {
	for _, body := range []struct{ name, body string }{{"chat1100B", benchChat}, {"prompt16", benchPrompt16}} {
		b.Run(body.name, func(b *testing.B) {
			d := []byte(body.body)
			b.SetBytes(int64(len(d)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Read(wire.API_API_CHAT, d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
