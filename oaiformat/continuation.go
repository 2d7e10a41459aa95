package oaiformat

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/switchyard-ai/switchyard/wire"
)

// Continuation builds the request body of a migrated attempt from the
// client's body and the text already sent: chat requests end with a
// partial assistant message and continue_final_message (vLLM's and
// SGLang's way to continue a message), completions append the text to the
// prompt. max_tokens, max_completion_tokens and min_tokens count down by
// the tokens sent; remaining is what the new attempt may still produce.
//
// A stream that sent reasoning is not continued here (see the broker): the
// engines' continuation continues the final message's content as the chat
// template renders it, and templates render an assistant message's
// reasoning differently (or drop it), so the new attempt would not
// continue the reasoning the client has.
func Continuation(api wire.API, body []byte, sent string, sentTokens int) (out []byte, remaining int, err error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, 0, err
	}
	if m == nil {
		return nil, 0, ErrNotObject
	}
	remaining = 1 << 30
	for _, k := range []string{"max_tokens", "max_completion_tokens", "min_tokens"} {
		if raw, ok := m[k]; ok && string(raw) != "null" {
			var n int
			if err := json.Unmarshal(raw, &n); err != nil {
				return nil, 0, fmt.Errorf("%s: %w", k, err)
			}
			n -= sentTokens
			if k != "min_tokens" {
				remaining = min(remaining, n)
			}
			m[k], _ = json.Marshal(max(n, 0))
		}
	}
	switch api {
	case wire.API_API_CHAT:
		var msgs []json.RawMessage
		if err := json.Unmarshal(m["messages"], &msgs); err != nil {
			return nil, 0, fmt.Errorf("messages: %w", err)
		}
		partial := append([]byte(`{"role":"assistant","content":`), AppendString(nil, sent)...)
		msgs = append(msgs, append(partial, '}'))
		m["messages"], _ = json.Marshal(msgs)
		m["continue_final_message"] = json.RawMessage("true")
		m["add_generation_prompt"] = json.RawMessage("false")
	case wire.API_API_COMPLETION:
		var prompt string
		if err := json.Unmarshal(m["prompt"], &prompt); err != nil {
			var one []string
			if err2 := json.Unmarshal(m["prompt"], &one); err2 != nil || len(one) != 1 {
				return nil, 0, errors.New("prompt: only a single prompt can be continued")
			}
			prompt = one[0]
		}
		m["prompt"] = AppendString(nil, prompt+sent)
	default:
		return nil, 0, fmt.Errorf("api %v cannot be continued", api)
	}
	out, err = json.Marshal(m)
	return out, remaining, err
}
