package simengine

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// mustExpectChoices is ExpectChoices or a fatal error.
func mustExpectChoices(t *testing.T, api API, body string) []Expectation {
	t.Helper()
	xs, err := ExpectChoices(api, []byte(body))
	if err != nil {
		t.Fatalf("ExpectChoices(%s): %v", body, err)
	}
	return xs
}

func completionTotal(xs []Expectation) int {
	n := 0
	for _, x := range xs {
		n += x.CompletionTokens
	}
	return n
}

// n > 1 gives n choices, each deterministic: choice 0 is what the request
// with n 1 gives, the others differ, and usage counts them all.
func TestChoicesResponse(t *testing.T) {
	srv := newTestServer(t, newTestEngine(t, testConfig()))
	for _, api := range []API{APIChat, APICompletion} {
		t.Run(api.String(), func(t *testing.T) {
			body := bodyFor(api, "tell me three stories", `"n":3,"max_tokens":20,"stop":" end"`)
			xs := mustExpectChoices(t, api, body)
			if len(xs) != 3 || !reflect.DeepEqual(xs[0], mustExpect(t, api, body)) || xs[1].Text == xs[0].Text || xs[2].Text == xs[1].Text {
				t.Fatalf("expectations %+v", xs)
			}
			x := fetch(t.Context(), srv.URL, api, body)
			if x.err != nil || x.status != http.StatusOK {
				t.Fatalf("%d %s: %v", x.status, x.raw, x.err)
			}
			var got struct {
				Choices []struct {
					Index   int     `json:"index"`
					Text    *string `json:"text"`
					Message *struct {
						Role    string `json:"role"`
						Content string `json:"content"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage usage `json:"usage"`
			}
			if err := json.Unmarshal(x.raw, &got); err != nil || len(got.Choices) != 3 {
				t.Fatalf("response %s: %v", x.raw, err)
			}
			for i, c := range got.Choices {
				text := ""
				if c.Text != nil {
					text = *c.Text
				} else if c.Message != nil && c.Message.Role == "assistant" {
					text = c.Message.Content
				}
				if c.Index != i || text != xs[i].Text || c.FinishReason != xs[i].FinishReason {
					t.Fatalf("choice %d: %s, want %q (%s)", i, x.raw, xs[i].Text, xs[i].FinishReason)
				}
			}
			if u := got.Usage; u.PromptTokens != xs[0].PromptTokens || u.CompletionTokens != completionTotal(xs) ||
				u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Fatalf("usage %+v", u)
			}
		})
	}
}

// A streamed n > 1 request sends one choice per chunk: a chat's role chunk
// per choice, the tokens of the choices side by side, a finish chunk per
// choice as it ends, then the usage of all.
func TestChoicesStream(t *testing.T) {
	e := newTestEngine(t, testConfig())
	for _, api := range []API{APIChat, APICompletion} {
		t.Run(api.String(), func(t *testing.T) {
			body := bodyFor(api, "two answers please", `"n":2,"max_tokens":12,"stream":true,"stream_options":{"include_usage":true}`)
			xs := mustExpectChoices(t, api, body)
			s := goStream(t.Context(), e, api, body)
			<-s.done
			if s.err != nil {
				t.Fatal(s.err)
			}
			texts := make([]strings.Builder, 2)
			finished := make([]string, 2)
			roles := 0
			var u *usage
			for _, raw := range s.chunks {
				var c chunk
				if err := json.Unmarshal(raw, &c); err != nil {
					t.Fatalf("chunk %s: %v", raw, err)
				}
				if c.Usage != nil {
					u = c.Usage
					continue
				}
				if len(c.Choices) != 1 {
					t.Fatalf("chunk %s: want one choice", raw)
				}
				ch := c.Choices[0]
				if ch.Index < 0 || ch.Index > 1 || finished[ch.Index] != "" {
					t.Fatalf("chunk %s after its choice finished", raw)
				}
				switch {
				case ch.FinishReason != nil:
					finished[ch.Index] = *ch.FinishReason
				case ch.Delta != nil && ch.Delta.Role != nil:
					roles++
				case ch.Delta != nil && ch.Delta.Content != nil:
					texts[ch.Index].WriteString(*ch.Delta.Content)
				case ch.Text != nil:
					texts[ch.Index].WriteString(*ch.Text)
				}
			}
			if api == APIChat && roles != 2 {
				t.Fatalf("%d role chunks, want 2", roles)
			}
			for i, x := range xs {
				if texts[i].String() != x.Text || finished[i] != x.FinishReason {
					t.Fatalf("choice %d: %q (%s), want %q (%s)", i, texts[i].String(), finished[i], x.Text, x.FinishReason)
				}
			}
			if u == nil || u.CompletionTokens != completionTotal(xs) || u.PromptTokens != xs[0].PromptTokens {
				t.Fatalf("usage %+v", u)
			}
		})
	}
}

// Under the batch model a request's choices share its prefill and decode
// side by side: each step counts the choices still generating.
func TestChoicesBatch(t *testing.T) {
	cfg := testConfig()
	cfg.Batch = testBatch()
	e := newTestEngine(t, cfg)
	st := newStepper(e)
	body := completionJSON(promptWords("q", 5), `"n":4,"max_tokens":9,"stop":[" the"," of"]`)
	xs := mustExpectChoices(t, APICompletion, body)
	outputs, shortest := 0, len(xs[0].Tokens)
	for _, x := range xs {
		outputs, shortest = max(outputs, len(x.Tokens)), min(shortest, len(x.Tokens))
	}
	if shortest == outputs {
		t.Fatal("every choice ends at once: choose a body whose choices end apart")
	}
	s := goStream(t.Context(), e, APICompletion, body)
	waitBatch(t, e, 1)
	if r := st.step(t); r.running != 0 || r.prefill != 5 {
		t.Fatalf("first step: %d decoding, %d prefilled; want the prompt prefilled once", r.running, r.prefill)
	}
	for k := 1; k < outputs; k++ {
		want := 0 // choices whose output k is still to come
		for _, x := range xs {
			if len(x.Tokens) > k {
				want++
			}
		}
		if r := st.step(t); r.running != want || r.prefill != 0 {
			t.Fatalf("step for output %d: %d decoding, want %d", k, r.running, want)
		}
	}
	<-s.done
	if s.err != nil {
		t.Fatal(s.err)
	}
}

// PD engines carry one sequence per hand-off: n > 1 is refused, naming n.
func TestChoicesRefusedByPD(t *testing.T) {
	_, srv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	res := do(t, t.Context(), srv.URL, APICompletion, completionJSON("x", with(vllmPrefillParams, `"n":2`)))
	if res.status != http.StatusBadRequest || res.err == nil || res.err.Param == nil || *res.err.Param != "n" {
		t.Fatalf("%d %s", res.status, res.raw)
	}
}
