package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/switchyard-ai/switchyard/wire"
)

// Declared reports whether a request member's JSON value (such as "tools")
// holds something: present, not null and not an empty array. The ingresses
// use it to set Request.NoMigration.
func Declared(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null")) && !bytes.Equal(bytes.Join(bytes.Fields(t), nil), []byte("[]"))
}

// recoverable reports whether an attempt's error may be repaired by another
// attempt. Before the first token that is what the agent says (nothing
// reached its engine's client); after it, any failure of the agent or
// engine, but never a request the engine judged bad or a passed deadline.
func recoverable(e *wire.Error, afterFirstToken bool) bool {
	if !afterFirstToken {
		return e.GetRetryable()
	}
	switch e.GetCode() {
	case wire.CodeBadRequest, wire.CodeDeadlineExceeded, wire.CodeCancelled:
		return false
	}
	return true
}

// recover abandons the current attempt: a retry before the first token, a
// migration after it.
func (c *Call) recover(ctx context.Context, why error) error {
	if c.firstToken.IsZero() {
		return c.retry(ctx, why)
	}
	return c.migrate(ctx, why)
}

// migrate continues a stream that already sent output on another agent:
// the new attempt's request carries the text so far (chat: a partial
// assistant message with continue_final_message; completions: the prompt
// plus the text), asks for the remaining tokens, and its chunks continue
// the client's stream. Usage is adjusted so the client sees the totals of
// one uninterrupted request.
func (c *Call) migrate(ctx context.Context, why error) error {
	if r := c.req.NoMigration; r != "" {
		return fmt.Errorf("request %s: stream broken after %d tokens; a stream with %s is not continued on another agent: %w", c.ID, c.tokens, r, why)
	}
	if c.migrations >= c.b.cfg.MigrationLimit {
		return fmt.Errorf("request %s: stream broken after %d tokens and %d migrations: %w", c.ID, c.tokens, c.migrations, why)
	}
	sentText := c.sent.String()
	body, remaining, err := continuation(c.req.API, c.req.Body, sentText, c.tokens)
	if err != nil {
		return fmt.Errorf("request %s: cannot continue the stream: %v: %w", c.ID, err, why)
	}
	if remaining < 1 {
		return fmt.Errorf("request %s: stream broken at its last token: %w", c.ID, why)
	}
	c.sentTokens = c.tokens
	c.body = body
	c.cont = &wire.Continuation{Text: sentText, CompletionTokens: uint32(c.tokens)}
	if err := c.startAttempt(ctx, migrationAttempt, why); err != nil {
		return fmt.Errorf("request %s: migration after %v: %w", c.ID, why, err)
	}
	return nil
}

// continuation builds the request body of a migrated attempt.
func continuation(api wire.API, body []byte, sent string, sentTokens int) ([]byte, int, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, 0, err
	}
	remaining := 1 << 30
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if raw, ok := m[k]; ok && string(raw) != "null" {
			var n int
			if err := json.Unmarshal(raw, &n); err != nil {
				return nil, 0, fmt.Errorf("%s: %w", k, err)
			}
			n -= sentTokens
			remaining = min(remaining, n)
			m[k], _ = json.Marshal(max(n, 0))
		}
	}
	switch api {
	case wire.API_API_CHAT:
		var msgs []json.RawMessage
		if err := json.Unmarshal(m["messages"], &msgs); err != nil {
			return nil, 0, fmt.Errorf("messages: %w", err)
		}
		partial, _ := json.Marshal(map[string]string{"role": "assistant", "content": sent})
		msgs = append(msgs, partial)
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
		m["prompt"], _ = json.Marshal(prompt + sent)
	default:
		return nil, 0, fmt.Errorf("api %v", api)
	}
	out, err := json.Marshal(m)
	return out, remaining, err
}

// continued rewrites a migrated attempt's chunk so the client's stream looks
// like one request: the first attempt's chunk id, and usage counting the
// tokens sent before the migration as completion, not prompt, tokens.
func (c *Call) continued(ch *wire.Chunk) {
	switch ch.GetKind() {
	case wire.Chunk_KIND_TOKEN:
		for _, ev := range ch.GetEvents() {
			ev.Raw = rewriteChunk(ev.Raw, c.streamID, nil)
		}
	case wire.Chunk_KIND_FINAL:
		if u := ch.GetUsage(); u != nil {
			n := uint32(c.sentTokens)
			u.CompletionTokens += n
			if u.PromptTokens >= n {
				u.PromptTokens -= n
			}
			u.TotalTokens = u.PromptTokens + u.CompletionTokens
			ch.Raw = rewriteChunk(ch.Raw, c.streamID, u)
		}
	}
}

func rewriteChunk(raw []byte, id string, u *wire.Usage) []byte {
	if len(raw) == 0 {
		return raw
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	if id != "" {
		m["id"], _ = json.Marshal(id)
	}
	if u != nil {
		m["usage"], _ = json.Marshal(map[string]uint32{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.TotalTokens})
	}
	out, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return out
}
