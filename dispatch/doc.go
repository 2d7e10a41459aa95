// Package dispatch is the broker's routing decision: for each request of a
// model, the regular queue or the prefill/decode (PD) pipeline of one
// pairing. It is pure: no NATS, no HTTP, no clock and no randomness of its
// own; the caller passes the time a snapshot is evaluated at, what it
// dispatched since the heartbeats (InFlight) and a random number per
// decision.
//
// The broker builds an immutable Model snapshot per model from the agents'
// heartbeats with NewModel (or all models at once with NewFleet), publishes
// it through a Table, and calls Model.Decide per request. All the work that
// does not depend on InFlight is done when the snapshot is built; Decide
// asks InFlight once per pool of each eligible route and draws once.
//
// # Eligibility: capacity is what serves
//
// An agent counts only while it is fresh (its last heartbeat is younger
// than Config.MissedHeartbeats of its heartbeat intervals, 3 by default), is
// ready (it pulls jobs) and has Slots > 0. A warming agent (engine not
// healthy yet, or never) counts zero, whatever its slots and for as long as
// it warms, and its view carries ReasonWarming and its StateReason; a
// draining or stale one counts zero too. A job sent to an agent that does
// not pull would wait in a queue nobody reads.
//
// # Pairings
//
// Prefill and decode agents hand off only to agents of the same PD
// protocol and declared labels: their pairing, subjects.PairKey(PDProtocol,
// PDLabels). A pairing is eligible only with at least one eligible prefill
// and one eligible decode agent; the agents of a pairing without a partner
// count zero, with ReasonNoPartner saying which side is missing. PD is
// eligible when any pairing is, and each pairing is a route of its own.
//
// # Effective slots and slow start
//
// A ready agent's effective slots are Ramp(Slots, ReadySince, now): they
// ramp linearly from a floor to its full Slots over Config.SlowStart after
// its ReadySince, so the first agents of a new pool are not hit by a storm.
// The floor is SlowStartFloor × Slots but at least 1 slot and at most
// Slots; effective slots are a float64 and are not rounded. They are
// further capped by the agent's own PullLimit when it reports one: the
// agent holds no more than that, so the broker counts no more.
//
// # Weights
//
// With R the eligible regular agents and, per eligible pairing g, P_g and
// D_g its eligible prefill and decode agents:
//
//	capacity (default)  regular = free(R)   pairing g = min(free(D_g), free(P_g))
//	paired              regular = |R|       pairing g = 2·min(|P_g|, |D_g|)
//	count               regular = |R|       pairing g = |P_g| + |D_g|
//
// capacity is in one unit, concurrent requests: a PD request holds a decode
// slot for its whole life, and the pipeline cannot hold more than its
// prefill pool feeds. free(pool) = max(0, effective slots − max(active by
// heartbeats, active seen by the broker) − dispatched and not yet taken),
// so the weights react between heartbeats. When every route is full,
// capacity falls back to effective slots (regular = eff(R), pairing g =
// min(eff(D_g), eff(P_g))), so the queues keep filling in proportion to
// capacity rather than all at one route. count is the SGLang reference
// gateway's rule and paired its fix for pairs, kept for comparison.
//
// Decide picks one of [regular, pairing 1, pairing 2, ...] with probability
// weight/(sum of weights), with one random number.
//
// # Requests PD cannot serve
//
// A request with Need.NoPD goes to regular if regular has an eligible agent
// (whatever the weights), and otherwise fails with ErrUnsupported, or
// ErrNoCapacity when PD has no eligible pairing either. It never goes to PD
// by chance.
package dispatch
