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
//
// Before the first token: once a job is taken and until its first token
// (or its end), the agent sends a keep-alive chunk every Config.Keepalive
// on the reply subject, outside the sequence (it repeats the sequence
// number of the accepted chunk); a prefill agent sends them in the
// prefill stage while its leg runs. The broker's stall timeout is for
// silence once tokens flow.
//
// PD: a prefill or decode agent pulls only the queue of its pairing
// (subjects.PDJobs with subjects.PairKey(protocol, labels)), and a prefill
// agent publishes each decode job to the decode queue of that same
// pairing, stamped with its pairing and Job.handoff_expires (now plus its
// engine's KV hold). A decode job taken after that is not run: it ends
// with a retryable handoff_expired error. A cancel that arrives after the
// hand-off never leaves KV held on the prefill engine: the prefill agent
// leaves its leg alone, and the decode agent lets its engine take the
// hand-off (up to its first chunk) before it aborts, in silence; a decode
// job of a request already cancelled is run the same way instead of
// dropped. A cancelled attempt sends nothing more on the reply subject.
//
// Slow start: a newly ready agent holds no more jobs than
// floor(dispatch.Ramp(slots, readySince, now)), at least one, the rule the
// broker weighs it with; the limit is in each heartbeat's pull_limit.
package agent
