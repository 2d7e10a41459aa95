package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// transportRepairLimit bounds the migrations of one stream for chunks
// NATS lost (ErrStreamBroken), beside Config.MigrationLimit for agents and
// engines that failed.
const transportRepairLimit = 3

// recoverable reports whether an attempt's error may be repaired by another
// attempt. Before the first token that is what the agent says (nothing
// reached its engine's client); after it, any failure of the agent or
// engine, but never a request the engine judged bad or a passed deadline.
func recoverable(e *wire.Error, afterFirstToken bool) bool {
	if !afterFirstToken {
		return e.GetRetryable()
	}
	switch e.GetCode() {
	case wire.CodeDeadlineExceeded, wire.CodeCancelled:
		return false
	}
	return wire.Repeatable(e.GetCode())
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
	if c.reasoned {
		// The engines continue a final message's content, not its
		// reasoning (see oaiformat.Continuation): a new attempt would start
		// the reasoning again in front of the client.
		return fmt.Errorf("request %s: stream broken after %d tokens; a stream that sent reasoning is not continued on another agent: %w", c.ID, c.tokens, why)
	}
	if preempted(why) {
		// Stopped for interactive work, as its agent may (batch class):
		// outside the migration limit, which is for failures.
		c.repairs++
	} else if c.b.cfg.MigrationLimit > 0 && errors.Is(why, ErrStreamBroken) && c.repairs < transportRepairLimit {
		// Chunks lost in transit (a NATS node failed under the stream)
		// are no fault of the agent or the request: they have a budget of
		// their own, so a stream that meets two node losses is continued
		// twice.
		c.repairs++
	} else if c.migrations-c.repairs >= c.b.cfg.MigrationLimit {
		return fmt.Errorf("request %s: stream broken after %d tokens and %d migrations: %w", c.ID, c.tokens, c.migrations, why)
	}
	sentText := c.sent.String()
	body, remaining, err := oaiformat.Continuation(c.req.API, c.req.Body, sentText, c.tokens)
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

// continued rewrites a migrated attempt's chunk so the client's stream looks
// like one request: the first attempt's chunk id, and usage counting the
// tokens sent before the migration as completion, not prompt, tokens; the
// usage's other members (token details) are the engine's.
func (c *Call) continued(ch *wire.Chunk) {
	switch ch.GetKind() {
	case wire.Chunk_KIND_TOKEN:
		for _, ev := range ch.GetEvents() {
			ev.Raw = oaiformat.RewriteChunk(ev.Raw, c.streamID, nil)
		}
	case wire.Chunk_KIND_FINAL:
		if u := ch.GetUsage(); u != nil {
			n := uint32(c.sentTokens)
			u.CompletionTokens += n
			if u.PromptTokens >= n {
				u.PromptTokens -= n
			}
			u.TotalTokens = u.PromptTokens + u.CompletionTokens
			ch.Raw = oaiformat.RewriteChunk(ch.Raw, c.streamID, u)
		}
	}
}
