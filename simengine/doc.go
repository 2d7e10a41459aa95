// Package simengine is a simulated vLLM-like inference engine.
//
// It serves the OpenAI chat and text completion APIs (streaming and not),
// /v1/models, /health and vLLM-named Prometheus gauges, and it runs
// in-process for the Switchyard agent through [Engine.Stream]. A real engine's
// cost model is imitated: a fixed number of slots (concurrent sequences), a
// FIFO waiting queue beyond them, a time to first token that grows with the
// prompt, and a constant inter-token latency.
//
// # Deterministic output
//
// The output is a pure function of the context (the prompt words followed by
// the words generated so far), never of timing or of the request's history:
//
//   - Words are strings.Fields of the text. A chat prompt is rendered as
//     "role: content\n" per message followed by "assistant:", or, with
//     continue_final_message and a final assistant message, with that message
//     rendered as "assistant: content" and nothing appended.
//   - The next word is drawn from a fixed 256-word vocabulary by an FNV-1a 64
//     hash of a fixed seed and the last two context words.
//   - The same hash ends the sequence (finish_reason "stop", nothing emitted)
//     when it is 0 mod 40 and the last four context words are all vocabulary
//     words, which in practice means at least four tokens were generated (a
//     rendered chat prompt ends with "assistant:", not a vocabulary word).
//     Otherwise the sequence ends with "length" after max_tokens tokens.
//   - Each token's text is " " + word.
//
// Hence resuming works exactly: a request whose prompt is the original prompt
// plus the text received so far, with max_tokens reduced by the number of
// tokens received, yields the rest of the uninterrupted output. [Expect]
// computes what a request must receive, without any timing.
package simengine
