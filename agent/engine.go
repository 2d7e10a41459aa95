package agent

import (
	"context"

	"github.com/switchyard-ai/switchyard/wire"
)

// Engine is what the agent needs from an inference engine adapter.
type Engine interface {
	// Stream runs one request and calls emit with each OpenAI streaming
	// chunk JSON the engine produces (without the [DONE] sentinel). The
	// request body always asks for a stream with usage. A refusal by the
	// engine is a *wire.Error.
	Stream(ctx context.Context, req *Request, emit Emit) error
}

// Emit takes one engine chunk; the slice may be reused after it returns.
// more reports that the next chunk is already at hand (it arrived with this
// one), so the agent may hold this one and send both in one message; an
// adapter that cannot tell passes false, and every chunk goes out at once.
// An adapter must never pass true and then wait on its engine.
type Emit func(chunk []byte, more bool) error

// Request is one job as an engine adapter sees it.
type Request struct {
	RequestID string
	API       wire.API
	// Body is the client's OpenAI request as oaiformat.StreamingBody
	// builds it: "stream" true, include_usage merged into its
	// stream_options. For a PD leg (a prefill job, or Job.Pd set) it is the
	// job's body as the broker sent it: the PD adapter builds the leg from
	// it in one pass (see oaiformat's leg bodies).
	Body []byte
	Job  *wire.Job
	// MaxAnswer, when positive, is the most bytes of a one-piece answer
	// (an embeddings answer) the agent relays: an adapter reads no more
	// than one byte past it, and fails a larger answer with
	// wire.CodeEngineOutputTooLarge. A stream's events are bounded by the
	// agent as they are emitted.
	MaxAnswer int64
	// PrefillUsage is set by a Prefiller before it hands off when its
	// engine answered the prefill leg first (vLLM): that answer, whose
	// usage says how many prompt tokens the engine prefilled. The agent
	// relays it in the hand-off chunk, from which the broker learns.
	PrefillUsage []byte
}

// Load is what an engine reports about its own queue.
type Load struct {
	Running, Waiting int
	KVCacheUsage     float64
	// PrefixQueries and PrefixHits are the engine's prefix-cache counters
	// (prompt tokens looked up and found cached since it started), when
	// HasPrefix says it reports them.
	PrefixQueries, PrefixHits float64
	HasPrefix                 bool
}

// LoadReporter is implemented by engines that can report their load; the
// agent puts it in heartbeats.
type LoadReporter interface {
	Load(ctx context.Context) (Load, error)
}

// HealthChecker is implemented by engines that can tell when they are ready
// to serve. The agent stays "warming" until Health returns nil.
type HealthChecker interface {
	Health(ctx context.Context) error
}

// Prefiller is implemented by adapters that serve the prefill role of the
// PD pipeline. Prefill runs the prefill leg of req and calls handoff exactly
// once with the data the decode leg needs, at the moment the protocol
// allows: SGLang before (or while) the prefill runs, since the decode engine
// waits on the bootstrap room; vLLM after the prefill returns its
// kv_transfer_params. The agent publishes the decode job from handoff. An
// error after handoff makes the agent fail the request (the broker cancels
// the decode leg).
type Prefiller interface {
	Prefill(ctx context.Context, req *Request, handoff func(*wire.PDHandoff) error) error
}

// The decode role needs no interface of its own: the agent calls Stream with
// req.Job.Pd set to the hand-off, and a PD-capable adapter adds the fields
// its engine needs (bootstrap_* or kv_transfer_params) to the request.
