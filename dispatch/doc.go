// Package dispatch is the broker's routing decision: for each request of a
// model, the regular queue or the prefill/decode (PD) pipeline. It is pure:
// no NATS, no HTTP, no clock and no randomness of its own; the caller passes
// the time a snapshot is evaluated at and a random number per decision.
//
// The broker builds an immutable Model snapshot per model from the agents'
// heartbeats with NewModel (or all models at once with NewFleet), publishes
// it through a Table, and calls Model.Decide per request. All the work is
// done when the snapshot is built; Decide is a comparison.
//
// # Eligibility
//
// An agent counts only while it is fresh (its last heartbeat is younger
// than Config.MissedHeartbeats of its heartbeat intervals, 3 by default), has
// Slots > 0, and is ready or warming. A draining agent counts zero.
//
// # Effective slots and slow start
//
// A ready agent's effective slots ramp linearly from a floor to its full
// Slots over Config.SlowStart after its ReadySince, so the first agents of
// a new pool are not hit by a storm. The floor is
// SlowStartFloor × Slots but at least 1 slot and at most Slots; effective
// slots are a float64 and are not rounded, so agents with few slots ramp
// smoothly too. A warming agent counts at the floor and does not ramp until
// it reports ready. A ready agent with a zero ReadySince counts in full.
// Free effective slots are max(0, effective − Active) per agent.
//
// # Weights
//
// PD is eligible only with at least one eligible prefill and one eligible
// decode agent, in every mode. With R, P and D the eligible agents of the
// regular, prefill and decode pools:
//
//	capacity (default)  regular = free(R)   PD = 2·min(free(P), free(D))
//	paired              regular = |R|       PD = 2·min(|P|, |D|)
//	count               regular = |R|       PD = |P| + |D|
//
// count is the SGLang reference gateway's rule, kept for comparison: it
// sends 11/17 of the traffic of 10 prefill + 1 decode + 6 regular agents
// through the one decode agent. capacity weighs what can actually be served:
// a PD request takes a prefill slot and a decode slot, so the pipeline is as
// wide as its narrower pool. When every route is full (both weights zero in
// free slots), capacity falls back to total effective slots,
// regular = eff(R) and PD = 2·min(eff(P), eff(D)), so the queues keep
// filling in proportion to capacity rather than all at one route.
//
// A route is chosen with probability weight/(regular + PD).
//
// # Requests PD cannot serve
//
// A request with Need.NoPD goes to regular if regular has an eligible agent
// (whatever the weights), and otherwise fails with ErrUnsupported, or
// ErrNoCapacity when PD has no eligible agents either. It never goes to PD
// by chance.
package dispatch
