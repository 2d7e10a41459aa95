package batch

import (
	"context"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	line := func(id, url, model string) string {
		return `{"custom_id":"` + id + `","method":"POST","url":"` + url + `","body":{"model":"` + model + `"}}`
	}
	ok := line("a", "/v1/embeddings", "m")
	for _, tc := range []struct {
		name   string
		input  string
		n      int
		codes  []string
		lines  []int
		params []string
	}{
		{name: "good, blank lines skipped", input: ok + "\n\n" + line("b", "/v1/embeddings", "m") + "\n", n: 2},
		{name: "no final newline", input: ok, n: 1},
		{name: "malformed", input: ok + "\n{\n", n: 2, codes: []string{"invalid_json_line"}, lines: []int{2}, params: []string{""}},
		{name: "duplicate", input: ok + "\n" + ok + "\n", n: 2, codes: []string{"duplicate_custom_id"}, lines: []int{2}, params: []string{"custom_id"}},
		{name: "url", input: line("a", "/v1/chat/completions", "m"), n: 1, codes: []string{"invalid_url"}, lines: []int{1}, params: []string{"url"}},
		{name: "model", input: line("a", "/v1/embeddings", "x"), n: 1, codes: []string{"model_not_found"}, lines: []int{1}, params: []string{"body.model"}},
		{name: "no custom_id", input: `{"method":"POST","url":"/v1/embeddings","body":{"model":"m"}}`, n: 1, codes: []string{"missing_required_parameter"}, lines: []int{1}, params: []string{"custom_id"}},
		{name: "body not an object", input: `{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":[1]}`, n: 1, codes: []string{"invalid_request"}, lines: []int{1}, params: []string{"body"}},
		{name: "too long", input: line("a", "/v1/embeddings", strings.Repeat("m", 300)) + "\n" + ok, n: 2, codes: []string{"line_too_long"}, lines: []int{1}, params: []string{""}},
		{name: "too many", input: ok + "\n" + line("b", "/v1/embeddings", "m") + "\n" + line("c", "/v1/embeddings", "m") + "\n", n: 3, codes: []string{"too_many_requests"}, lines: []int{3}, params: []string{""}},
		{name: "empty", input: "\n \n", codes: []string{"empty_file"}, params: []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, errs, err := validate(context.Background(), strings.NewReader(tc.input), "/v1/embeddings", 200, 2, []string{"m"})
			if err != nil {
				t.Fatal(err)
			}
			if len(tc.codes) == 0 && n != tc.n {
				t.Fatalf("%d lines, want %d", n, tc.n)
			}
			if len(errs) != len(tc.codes) {
				t.Fatalf("errors %+v, want codes %v", errs, tc.codes)
			}
			for i, e := range errs {
				p := ""
				if e.Param != nil {
					p = *e.Param
				}
				if e.Code != tc.codes[i] || p != tc.params[i] && tc.params != nil || (tc.lines != nil && (e.Line == nil || *e.Line != tc.lines[i])) {
					t.Fatalf("error %d: %+v (param %q line %v), want %s", i, e, p, e.Line, tc.codes[i])
				}
			}
		})
	}
}

// TestValidateErrorsBounded lists at most maxErrors refusals and counts
// the rest in a last entry.
func TestValidateErrorsBounded(t *testing.T) {
	in := strings.Repeat("{\n", maxErrors+7)
	_, errs, err := validate(context.Background(), strings.NewReader(in), "/v1/embeddings", 100, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != maxErrors+1 || errs[maxErrors].Code != "too_many_errors" || !strings.HasPrefix(errs[maxErrors].Message, "7 ") {
		t.Fatalf("%d errors, last %+v", len(errs), errs[len(errs)-1])
	}
}
