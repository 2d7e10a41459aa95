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
// code, an accepted body has a sane model and n, and no accepted body
// carries a hand-off field as an engine reads keys.
func FuzzRead(f *testing.F) {
	for _, tc := range parseCases {
		f.Add(uint8(tc.api), []byte(tc.body))
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
