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
// slo and threshold keep capacity's weights as their frame (see below).
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
// # Latency targets: slo
//
// ModeSLO decides per request, by what decides its latency: how long its
// prompt is (Need.PromptTokens), how much of it each route already caches
// (Need.Cache), how long each queue is and how fast each pool works
// (Agent.Timing, learned by the broker from the chunks it relays), and
// that a long prefill on a regular engine stalls every decode running
// beside it. With P the prompt tokens not cached on a route, N the
// regular pool's output tokens per request, and a pool's figures averaged
// over its eligible agents by effective slots:
//
//	regular  TTFT = QueueWait + P / PrefillRate
//	         ITL  = ITL + (P / PrefillRate) / N   (if the pool holds requests)
//	PD       TTFT = prefill QueueWait + P / prefill PrefillRate + decode TTFT
//	         ITL  = decode ITL
//
// ITL is the mean time per output token after the first, the figure a
// target bounds. An engine's batch step costs about base + perSeq ×
// running + perToken × prefill tokens in the step: the learned ITL is the
// mean time per token as it is, 1/PrefillRate is perToken, so the
// request's prefill delays each decode running beside it by P /
// PrefillRate in all, however it is chunked, which spread over a
// stream's N tokens is what it adds to their time per output token. A
// decode agent's TTFT is the PD hop: its queue, the KV transfer and the
// first step.
//
// A route's headroom is the smallest (target − predicted) / target over
// the request's targets (Need.Targets). Among the routes with free
// capacity, Decide takes the one with the most headroom: the one that meets
// the targets by the widest margin, or, when none meets them, the one that
// misses least; equal headroom is drawn by capacity weight. Capacity stays
// the frame: a route with no free slots (InFlight included) is never
// chosen, slow start and warming hold as in capacity mode, and when every
// route is full the capacity fall-back decides. Without targets, without a
// prompt length, or when some eligible route has no fresh history (no
// samples, no prefill rate where it prefills, or figures older than
// Config.TimingMaxAge), Decide weighs exactly as ModeCapacity, which also
// lets a route the predictions avoided earn fresh figures. Before its
// figures age out, such a route is probed: a share of the requests with
// targets and a short prompt (Config.ProbeShare, ProbeTokens) go to a
// route they would not have gone to whose figures are stale (ProbeAge,
// ProbeSamples) and that has free capacity, marked Decision.Probe; the
// probe is drawn from the low 11 bits of the random number, which the
// weighted draw leaves unused.
//
// ModeThreshold is the reference decider of llm-d: PD when the prompt
// tokens not cached on the regular pool exceed Config.PDThreshold, else
// regular, each pairing of PD by capacity weight. When the chosen route has
// no free capacity the other one takes the request if it has some; when
// neither has, the chosen one does (or the other, if the chosen one has no
// eligible agent). Without a prompt length it weighs as ModeCapacity.
//
// # Requests PD cannot serve
//
// A request with Need.NoPD goes to regular if regular has an eligible agent
// (whatever the weights), and otherwise fails with ErrUnsupported, or
// ErrNoCapacity when PD has no eligible pairing either. It never goes to PD
// by chance.
package dispatch
