// Package affinity holds the building blocks of prefix-cache affinity: the
// block keys of a prompt, the [Tree] that remembers which agent recently
// served (or whose engine holds) which prompt prefix, and [Choose], the pure
// decision of which agent, if any, a request should be offered to first.
//
// A prompt is cut into blocks of a fixed number of pieces
// ([DefaultBlockSize] by default), where a piece is a whitespace-separated
// word, or at most [MaxPieceBytes] bytes of a longer one: a token-less
// stand-in for the engine's tokens, so that the broker never tokenizes. Block i's key hashes block i's pieces seeded
// with block i-1's key, so equal keys mean equal prefixes and a prefix
// match is a walk over the keys in order, as in the reference gateway's
// approximate tree and llm-d's approximate scorer.
//
// The package imports no NATS and no HTTP: the broker feeds it what it
// dispatched and what agents report, and wires its decision; see
// docs/affinity.md.
package affinity
