package broker

import "errors"

// Errors of Submit and Call.Next. Ingress packages map them to HTTP and gRPC
// statuses; they are wrapped with the model or request id.
var (
	// ErrUnknownModel: no agent has ever served the model (HTTP 404).
	ErrUnknownModel = errors.New("unknown model")
	// ErrNoModel: the request names no model and more than one is served (400).
	ErrNoModel = errors.New("model required")
	// ErrNoCapacity: the model is known but no live agent can take the job (503).
	ErrNoCapacity = errors.New("no live agent for model")
	// ErrUnsupported: the request needs a route that has no capacity (e.g. a
	// parameter PD cannot serve and no regular agent exists).
	ErrUnsupported = errors.New("request not supported by the live agents")
	// ErrQueueFull: the pool's job queue is at its bound (429 with Retry-After).
	ErrQueueFull = errors.New("job queue full")
	// ErrQueueTimeout: no agent took the job within the queue timeout (503
	// with Retry-After); the job is cancelled and never starts.
	ErrQueueTimeout = errors.New("no agent took the job in time")
	// ErrStreamUnusable: the jobs stream cannot take jobs (the broker could
	// not create it, the servers refuse its writes, or it has no leader);
	// Ready says why.
	ErrStreamUnusable = errors.New("jobs stream unusable")
	// ErrNotConnected: NATS is unreachable right now (503).
	ErrNotConnected = errors.New("not connected to NATS")
	// ErrTimeout: the request's deadline passed before it finished (504).
	ErrTimeout = errors.New("request deadline exceeded")
	// ErrStalled: the agent stopped sending chunks or heartbeats.
	ErrStalled = errors.New("agent stalled")
	// ErrStreamBroken: a chunk was missing from the reply stream.
	ErrStreamBroken = errors.New("reply stream broken")
	// ErrSlowReader: the client did not keep up and its buffer filled.
	ErrSlowReader = errors.New("client too slow")
	// ErrAnswerTooLarge: the engine's answer passed Config.MaxAnswerBytes
	// (HTTP 502); its engine request is cancelled, and another attempt
	// would meet the same answer.
	ErrAnswerTooLarge = errors.New("engine answer too large")
	// ErrClosed: the broker is shutting down.
	ErrClosed = errors.New("broker closed")
	// ErrShutdown: the broker's shutdown grace ended before the request
	// did (EndCalls); the client may retry it on another broker (503).
	ErrShutdown = errors.New("broker shut down before the request ended")
)
