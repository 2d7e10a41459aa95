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
//
// # Prefill/decode disaggregation
//
// [Config.Role] makes an engine a prefill or a decode engine of
// [Config.PDProtocol]. A prefill engine runs a side channel, the bootstrap
// server, on BootstrapHost:BootstrapPort from [New] until [Engine.Close].
// The "KV" it hands over is a fingerprint of the model and the prompt
// words, so a decode leg given another prompt's hand-off fails. A hand-off
// is single use: the decode that claims it consumes it; unclaimed ones are
// dropped after 60s. The decode leg generates exactly what a regular engine
// generates for the same body ([Expect] holds for it), with no prefill
// cost: its first token comes one ITL after the KV arrived. It holds a slot
// while it waits for the KV, as a real decode engine preallocates its KV.
//
// vLLM (NixlConnector style): the prefill request carries
// kv_transfer_params with do_remote_decode true and must not stream (the
// router sends max_tokens 1); it costs the usual TTFT, and its response is
// the regular non-streaming one with a top-level kv_transfer_params
// (do_remote_prefill true, remote_engine_id, remote_block_ids, remote_host,
// remote_port, tp_size 1); [Engine.Stream] appends it to the usage chunk.
// The decode request carries that object unchanged; the decode engine
// pulls the blocks from remote_host:remote_port within BootstrapTimeout.
//
// SGLang: both legs carry bootstrap_host, bootstrap_port (the prefill
// engine's side channel) and bootstrap_room (any uint64, decoded exactly)
// and are sent at the same time. The prefill registers the room when the
// request arrives and marks it done once prefilled, or failed if it ends
// earlier (a cancel, a failed write), which fails a waiting decode at once.
// The prefill answers as a regular engine would with max_tokens 1, stream
// or not; SGLang routers discard that answer. The decode long-polls the
// room: BootstrapTimeout bounds how long it waits for the room to appear,
// not for a registered prefill to finish.
//
// A request without the protocol's fields is refused with 400 by a PD
// engine. A failed hand-off is an *[Error] with status 500, code
// "kv_transfer_failed", matching [ErrKVTransfer]: the HTTP response, or,
// once a stream has started, an event data: {"error":{...}} followed by
// [DONE]. Regular engines ignore every PD field.
package simengine
