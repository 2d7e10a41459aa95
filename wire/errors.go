package wire

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Error codes carried in Chunk.error.code. The broker maps them to HTTP and
// gRPC statuses in its ingress packages.
const (
	CodeBadRequest       = "bad_request"        // the engine refused the request as invalid
	CodeEngine           = "engine_error"       // the engine failed or broke the stream
	CodeEngineDown       = "engine_unavailable" // the engine could not be reached
	CodeDeadlineExceeded = "deadline_exceeded"  // the job's deadline passed
	CodeCancelled        = "cancelled"          // the request was cancelled
	CodeDraining         = "draining"           // the agent is shutting down
	CodeInternal         = "internal"
	// CodeHandoffExpired: a decode job was taken after its prefill engine's
	// KV hold ended (Job.handoff_expires), so it was not run; retryable,
	// nothing reached the client.
	CodeHandoffExpired = "handoff_expired"
	// CodeQueueFull: a job queue the agent publishes to (a prefill agent's
	// decode queue) is at its bound; retryable, like a full queue at the
	// broker (429 with Retry-After when no retry is left).
	CodeQueueFull = "queue_full"
	// CodeEngineMisconfigured: the engine refused the agent itself (401 or
	// 403: a wrong engine API key; 404 for the model: the engine serves
	// another one). Not the client's fault: the agent stops serving until
	// its engine accepts it again, and the request is retried elsewhere.
	CodeEngineMisconfigured = "engine_misconfigured"
	// CodeUnsupportedAPI: the agent's engine does not serve the request's
	// API (e.g. /v1/embeddings on a generation-only engine).
	CodeUnsupportedAPI = "unsupported_api"
	// CodeEngineOutputTooLarge: the engine sent an SSE line, event or
	// answer larger than the agent relays. Another attempt would meet the
	// same answer, so it is not retried; the client gets a 502.
	CodeEngineOutputTooLarge = "engine_output_too_large"
	// CodeEngineStalled: the engine stopped producing events (after its
	// headers, or between tokens) for longer than the agent waits; its
	// request was cancelled. Retryable before the first token.
	CodeEngineStalled = "engine_stalled"
	// CodePreempted: the agent stopped a preemptible job (Job.preemptible,
	// batch work) to give its slot to interactive work. Retryable at any
	// point: the broker runs it again, outside its retry and migration
	// limits.
	CodePreempted = "preempted"
)

// Repeatable reports whether another attempt (elsewhere, or the same
// engine again) could end differently from an error with this code: not
// for a request an engine judged bad, nor for an answer too large to relay.
func Repeatable(code string) bool {
	return code != CodeBadRequest && code != CodeEngineOutputTooLarge
}

// Is makes errors.Is(err, &Error{Code: c}) match any *Error with code c, as
// jetstream.APIError does for its error codes.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) || t == nil {
		return false
	}
	return e.GetCode() == t.GetCode()
}

// Error implements the error interface.
func (e *Error) Error() string {
	if e == nil {
		return "<nil>"
	}
	return e.GetCode() + ": " + e.GetMessage()
}

// MaxEngineText bounds the bytes of an engine's own words (an error
// body's message) that an error carries on to the client: an engine's
// error page, a stack trace or a compromised engine's bytes are not the
// client's to read in full.
const MaxEngineText = 512

// EngineText returns s as an error message may quote it: control
// characters (line breaks included) as spaces, invalid UTF-8 as U+FFFD,
// surrounding space trimmed, and at most MaxEngineText bytes, cut on a
// character boundary with "..." when longer.
func EngineText(s string) string {
	var b strings.Builder
	b.Grow(min(len(s), MaxEngineText+3))
	for _, r := range strings.TrimSpace(s) {
		if unicode.IsControl(r) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > MaxEngineText {
			b.WriteString("...")
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
