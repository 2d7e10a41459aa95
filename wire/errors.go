package wire

import "errors"

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
)

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
