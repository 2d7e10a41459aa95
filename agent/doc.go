// Package agent is the worker agent that runs beside one inference engine.
// It heartbeats its capacity, pulls jobs from its pool's durable JetStream
// consumer only while it has free slots, hands each job to its Engine, and
// streams the engine's chunks back on the job's reply subject.
//
// Ack point: a job is acknowledged right after the agent has checked its
// deadline and whether it was cancelled, as it sends the accepted chunk and
// calls the engine (a plain ack; a prefill agent double-acks, so the server
// confirms the job is its own before it hands off). From then on the
// broker, not JetStream, owns the outcome: it sees the accepted chunk, the
// tokens and the end, relays only the first agent that speaks for an
// attempt, and alone decides on a retry or migration with a new attempt
// number. Acking at the end instead would let JetStream redeliver a
// half-streamed job to a second agent after AckWait, duplicating tokens the
// client already has.
package agent
