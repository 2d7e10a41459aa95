package openaihttp

import "testing"

func TestAppendEvent(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"one line", `{"a":1}`, "data: {\"a\":1}\n\n"},
		{"lines", "{\"a\":\n1}", "data: {\"a\":\ndata: 1}\n\n"},
		{"crlf and cr", "a\r\nb\rc", "data: a\ndata: b\ndata: c\n\n"},
		{"trailing newline", "a\n", "data: a\ndata: \n\n"},
		{"done", "[DONE]", "data: [DONE]\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(appendEvent(nil, []byte(tc.data))); got != tc.want {
				t.Errorf("appendEvent(%q) = %q, want %q", tc.data, got, tc.want)
			}
		})
	}
}
