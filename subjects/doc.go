// Package subjects is the only place where Switchyard builds and parses NATS
// subjects. Every user-supplied string (a model id, an agent id) is escaped
// into a single subject token first, so nothing a client sends can add a
// token, a wildcard or whitespace to a subject.
//
// The layout, with the default prefix "sy":
//
//	sy.jobs.<model>.regular                  regular jobs (JetStream work queue)
//	sy.jobs.<model>.<pool>.<pairing>         prefill and decode jobs of one PD pairing
//	sy.to.<model>.<pool>[.<pairing>].<agent>  jobs offered to one agent (affinity), in a stream of their own
//	sy.jobs.<model>.batch.<pool>[.<pairing>] batch-class jobs of a pool (work classes)
//	sy.hb.<model>.<pool>.<agent>             heartbeats (core NATS, JSON)
//	sy.reply.<broker>.chunks                 framed chunks for one broker (core NATS)
//	sy.cancel.<request>                      cancel of one request (core NATS)
//	sy.kv.<model>.<pool>.<agent>             an agent's engine KV events (affinity)
//	sy.learn.<model>.<pool>.<broker>         what a broker offered where (affinity)
//
// Escaping keeps ASCII letters, digits and '-' as they are and writes every
// other byte as '_' followed by two upper-case hex digits, so "a.b" becomes
// "a_2Eb". The mapping is injective and reversible and its output is never
// empty and never holds '.', '*', '>', whitespace or a non-ASCII byte.
package subjects
