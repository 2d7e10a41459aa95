// Package agent is the worker agent that runs beside one inference engine.
// It heartbeats its capacity, pulls jobs from its pool's durable JetStream
// consumer only while it has free slots, hands each job to its Engine, and
// streams the engine's chunks back on the job's reply subject.
//
// Ack point: a job is acknowledged (double-ack, so the server confirms it
// removed the job) right after the agent has checked its deadline and before
// it calls the engine. From then on the broker, not JetStream, owns the
// outcome: it sees the accepted chunk, the tokens and the end, and it alone
// decides on a retry or migration with a new attempt number. Acking at the
// end instead would let JetStream redeliver a half-streamed job to a second
// agent after AckWait, duplicating tokens the client already has.
package agent
