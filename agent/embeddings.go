package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/switchyard-ai/switchyard/wire"
)

// Embedder is implemented by engines that serve /v1/embeddings.
type Embedder interface {
	// Embed relays the client's request body to the engine as is and
	// returns the engine's answer as is: its HTTP status and JSON body. An
	// error means the engine gave no answer the client should see (it was
	// unreachable, or refused the agent: see wire.CodeEngineMisconfigured
	// and wire.CodeUnsupportedAPI).
	Embed(ctx context.Context, req *Request) (status int, body []byte, err error)
}

// embed runs an embeddings job: one JSON answer, relayed in the final
// chunk's raw (an engine's refusal of the request in the error chunk's
// raw, with its status), never a stream.
func (a *Agent) embed(ctx context.Context, job *wire.Job, out *stream) {
	em, ok := a.engine.(Embedder)
	if !ok {
		a.metrics.jobs.WithLabelValues(JobError).Inc()
		// Retryable: another agent's engine may serve embeddings.
		out.fail(&wire.Error{Code: wire.CodeUnsupportedAPI, Retryable: true,
			Message: fmt.Sprintf("agent %s's engine (%s) does not serve /v1/embeddings", a.cfg.ID, a.cfg.Engine)})
		return
	}
	out.called = time.Now()
	limit := a.answerLimit()
	status, body, err := em.Embed(ctx, &Request{RequestID: job.GetRequestId(), API: job.GetApi(), Body: job.GetBody(), Job: job, MaxAnswer: limit})
	a.metrics.duration.Observe(time.Since(out.called).Seconds())
	if err == nil && int64(len(body)) > limit {
		// An adapter that does not bound its read: the answer would not
		// reach the broker in one message.
		err = &wire.Error{Code: wire.CodeEngineOutputTooLarge, Message: fmt.Sprintf("the engine's embeddings answer has %d bytes, more than the %d the agent relays", len(body), limit)}
	}
	switch {
	case err == nil && status == http.StatusOK:
		a.metrics.jobs.WithLabelValues(JobOK).Inc()
		out.ended = true
		if err := out.send(&wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Raw: body}); err != nil {
			a.log.Warn("final chunk not sent", "request", job.GetRequestId(), "err", err)
		}
	case err == nil:
		// The engine judged the request: its answer goes to the client as
		// it is, unless it is the engine's own failure, which another agent
		// may not share.
		we := &wire.Error{Code: wire.CodeBadRequest, HttpStatus: uint32(status),
			Message: fmt.Sprintf("engine answered %d: %s", status, engineMessage(body))}
		if status >= 500 || status == http.StatusTooManyRequests {
			we.Code, we.Retryable = wire.CodeEngine, true
			a.avoid.failedHere(job.GetRequestId(), job.GetAttempt(), time.Now())
		}
		a.metrics.jobs.WithLabelValues(errorOutcome(we)).Inc()
		out.ended = true
		if err := out.send(&wire.Chunk{Kind: wire.Chunk_KIND_ERROR, Error: we, Raw: body}); err != nil {
			a.log.Warn("error chunk not sent", "request", job.GetRequestId(), "err", err)
		}
	default:
		a.finish(ctx, out, job.GetRequestId(), err)
	}
}

// replyOverhead is room in a reply message for what a one-piece answer's
// chunk carries beside the answer: ids, secret, framing.
const replyOverhead = 4 << 10

// answerLimit is the most bytes of a one-piece answer the agent relays:
// Config.MaxAnswerBytes, and what one NATS message carries. A larger one
// is an error the client gets at once, not a reply NATS refuses and a
// client that waits for its deadline.
func (a *Agent) answerLimit() int64 {
	limit := a.cfg.MaxAnswerBytes
	if mp := a.nc.MaxPayload() - replyOverhead; mp > 0 && mp < limit {
		limit = mp
	}
	return limit
}

// engineMessage is the message of an OpenAI-shaped error body, or the body.
func engineMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		if e.Error.Message != "" {
			return wire.EngineText(e.Error.Message)
		}
		if e.Message != "" {
			return wire.EngineText(e.Message)
		}
	}
	return wire.EngineText(string(body))
}
