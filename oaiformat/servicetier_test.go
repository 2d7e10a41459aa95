package oaiformat

import (
	"errors"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

func TestServiceTier(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, body string
		flex       bool
		code       string
	}{
		{"absent", `{` + msgs + `}`, false, ""},
		{"null", `{"service_tier":null,` + msgs + `}`, false, ""},
		{"auto", `{"service_tier":"auto",` + msgs + `}`, false, ""},
		{"default", `{"service_tier":"default",` + msgs + `}`, false, ""},
		{"priority runs as interactive", `{"service_tier":"priority",` + msgs + `}`, false, ""},
		{"flex", `{"service_tier":"flex",` + msgs + `}`, true, ""},
		{"last duplicate wins", `{"service_tier":"flex","service_tier":"auto",` + msgs + `}`, false, ""},
		{"escaped name", `{"service_t\u0069er":"flex",` + msgs + `}`, true, ""},
		// Member names match exactly, as the engines read them.
		{"other case ignored", `{"Service_Tier":"flex",` + msgs + `}`, false, ""},
		{"unknown tier", `{"service_tier":"scale",` + msgs + `}`, false, "invalid_value"},
		{"upper case tier", `{"service_tier":"FLEX",` + msgs + `}`, false, "invalid_value"},
		{"number", `{"service_tier":1,` + msgs + `}`, false, "invalid_type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Read(wire.API_API_CHAT, []byte(tc.body))
			if tc.code != "" {
				var e *Error
				if !errors.As(err, &e) || e.Code != tc.code || e.Param != "service_tier" {
					t.Fatalf("Read = %+v, %v; want %s on service_tier", p, err, tc.code)
				}
				return
			}
			if err != nil || p.Flex != tc.flex {
				t.Fatalf("Read = %+v, %v; want Flex %v", p, err, tc.flex)
			}
		})
	}
	// Completions read it alike.
	p, err := Read(wire.API_API_COMPLETION, []byte(`{"prompt":"x","service_tier":"flex"}`))
	if err != nil || !p.Flex {
		t.Fatalf("completion: %+v, %v", p, err)
	}
}
