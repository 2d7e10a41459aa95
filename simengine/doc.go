// Package simengine is a simulated vLLM-like inference engine.
//
// It serves the OpenAI chat and text completion APIs (streaming and not),
// /v1/models, /health and vLLM-named Prometheus gauges, and it runs
// in-process for the Switchyard agent through [Engine.Stream]. A real engine's
// cost model is imitated: a fixed number of slots (concurrent sequences), a
// FIFO waiting queue beyond them, a time to first token that grows with the
// prompt ([Config.TTFT] + prompt tokens x [Config.PrefillPerToken], so a
// long prompt's first token can take seconds), and a constant inter-token
// latency. [Config.Batch] replaces the constant model with engine steps
// in which prefills slow the decodes beside them; see "Batch model".
//
// # Batch model
//
// With [BatchModel.Enabled] the engine times tokens as a continuous
// batching engine with chunked prefill does (vLLM's scheduler, Sarathi's
// stall-free batches). One goroutine per engine runs steps while any
// sequence is in the batch, and none runs while the engine is idle.
// [Config.Slots] is the engine's max-num-seqs: a request joins the batch
// when it gets its slot, and further requests wait in the FIFO queue.
// Each step decodes one token of every sequence whose prompt is
// prefilled (each choice of a request with n > 1 is a sequence, and its
// prompt is prefilled once), and prefills up to
// [BatchModel.MaxBatchedTokens] prompt tokens of the others, in the order
// they joined. A step that decodes r sequences and prefills p tokens lasts
//
//	StepTime + r x StepPerSeq + p x StepPerPrefillToken
//
// ([BatchModel.StepDuration]). A sequence's first token comes at the end
// of the step that prefills its last prompt token, and each next token
// one step later, so a regular engine's inter-token latency rises while
// long prompts prefill beside its decodes. Prompt tokens found in the
// prefix cache are not prefilled. A decode engine prefills nothing: a
// decode leg joins the batch [BatchModel.KVTransferPerToken] x prompt
// tokens after its prefill engine handed its KV over, and its first token
// comes one step later. A prefill engine's legs end with their first
// token (an SGLang prefill always does; vLLM routers send max_tokens 1),
// so it only prefills. Output stays what [Expect] says: the batch
// model changes when tokens come, never which.
//
// The defaults ([DefaultBatchModel], cmd/sim-engine's flags) model
// Llama-3.1-8B-Instruct in 16-bit weights on one H100 80GB under vLLM
// (the slot count keeps the simulator's own default):
//
//   - StepTime 6.4ms and StepPerSeq 40µs: InferenceBench's published
//     concurrency sweep of that model on one H100-80GB-HBM3 with vLLM
//     0.21.0 ("Recipe: concurrency sweep") gives a median TPOT of 6.48ms
//     at concurrency 1 and 6.59ms at concurrency 4.
//   - StepPerPrefillToken 40µs (25k prompt tokens/s): an estimate, since
//     that sweep does not give prompt lengths: 2 x 8e9 FLOPs a token at
//     about 40% of the H100's 989 dense 16-bit TFLOPS.
//   - MaxBatchedTokens 8192: vLLM's default max_num_batched_tokens for its
//     OpenAI server on a GPU of at least 70 GiB other than an A100
//     (EngineArgs batch defaults; 2048 elsewhere).
//   - KVTransferPerToken 5µs: an estimate: the model's KV is 128 KiB a
//     token (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes), over
//     a 200 Gb/s RDMA link at about 25 GB/s, as NIXL moves it.
//
// # Loading
//
// A real engine loads its weights for minutes after it starts. For
// [Config.LoadTime] after [New] (forever with [LoadNever]) the engine
// serves but is not ready: /health, /v1/models and the completion routes
// answer 503 with code "model_loading", [Engine.Stream] and
// [Engine.Health] return that *[Error] (matching [ErrLoading]), and the
// gRPC HealthCheck, Generate, GetModelInfo and GetTokenizer fail with
// Unavailable. /metrics (with switchyard_sim_loaded 0), GetServerInfo,
// GetLoads and Abort answer throughout, and the bootstrap side channel of
// a prefill engine is up. [Engine.Loaded] tells when loading is over.
// (vLLM's HTTP server listens only once loaded, so a probe fails to
// connect; SGLang's /health answers 503 while its server is starting. A
// 503 models both for a prober.)
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
// A request with n > 1 (at most [MaxN]) gets n choices generated side by
// side, choice i from a seed of its own: choice 0 is what the request
// with n 1 gets, the others differ from it and from each other, and
// [ExpectChoices] gives them all. Streamed, each chunk carries one choice
// (a chat's role chunk comes once per choice, and each choice has its
// own finish chunk); the usage counts every choice's tokens. The request
// holds one slot. Only choice 0 resumes exactly; PD engines and the gRPC
// service refuse n > 1 with 400 (InvalidArgument) naming n.
//
// # Prefix cache
//
// With [Config.PrefixCacheBlocks] the engine caches prompt prefixes as
// vLLM's automatic prefix caching does: full blocks of
// [Config.PrefixBlockSize] tokens (prompt words) named by chained hashes,
// in an LRU of that many blocks. A request is looked up when it gets its
// slot; its longest cached prefix, at most all but its last token, is not
// prefilled, so its first token comes after TTFT + PrefillPerToken x the
// uncached prompt tokens. Its prompt blocks are cached once prefilled and
// the blocks its output fills once it ends, so the next turn of a
// conversation, which re-sends the previous answer, hits them too.
// /metrics counts vLLM's vllm:prefix_cache_queries_total and
// vllm:prefix_cache_hits_total, in prompt tokens. Usage reports a request's
// cached prompt tokens as vLLM does with --enable-prompt-tokens-details:
// "prompt_tokens_details":{"cached_tokens":N} (the gRPC service's
// cached_tokens), on engines with the cache that prefill the request.
//
// A block's hash is the broker's block key of the same text
// ([affinity.AppendKeys] over the rendered prompt), so with
// [Config.KVEvents] the engine publishes, in vLLM's format (package
// kvevents), KV events that name exactly what the broker looks up:
// BlockStored per run of new blocks (parent hash, one token id per word),
// BlockRemoved for evictions. A decode engine does not use the cache.
//
// With [Config.KVHash] [KVHashTokens] the cache behaves as real vLLM's
// instead: blocks are token ids of the simulator's tokenizer over a
// ChatML rendering of the chat (a different template from the broker's),
// named by hashes of (parent hash, token ids) chained from a per-process
// seed, and the counters count those tokens. Only an agent that
// tokenizes each prompt with the engine (POST /tokenize, vLLM's shape,
// byte-level token strings) can translate its events to broker keys.
//
// # Prefill/decode disaggregation
//
// [Config.Role] makes an engine a prefill or a decode engine of
// [Config.PDProtocol]. A prefill engine runs a side channel, the bootstrap
// server, on BootstrapHost:BootstrapPort from [New] until [Engine.Close].
// The "KV" it hands over is a fingerprint of the model and the prompt
// words, so a decode leg given another prompt's hand-off fails. A hand-off
// is single use: the decode that claims it consumes it. The decode leg
// generates exactly what a regular engine
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
// # Held KV
//
// A prefill engine holds each hand-off's KV, ceil(prompt tokens /
// [KVBlockSize]) blocks (at least 1), from the end of its prefill (its
// first token) until one of:
//
//   - a decode reads it (vLLM: its pull; SGLang: its poll of the done
//     room);
//   - the decode engine says its request was aborted before it read the
//     KV (while queued for a slot or waiting for the KV), as real engines
//     do: vLLM's NixlConnector notifies the prefill of a decode request
//     finished with do_remote_prefill still set (aborted before it was
//     scheduled) so that it frees the blocks, and SGLang's decode sends an
//     abort for its bootstrap room, which fails the room on the prefill
//     (a pending room then holds nothing when its prefill ends);
//   - [Config.KVHoldTimeout] passes (default 30s, vLLM NixlConnector's
//     kv_lease_duration; VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480s, before the
//     lease existed), which counts it as expired;
//   - [Engine.Close].
//
// A vLLM prefill aborted after its KV was ready but before its last token
// frees it at once (vLLM holds KV only for a request that finished by
// length). An abort of the prefill leg once it has finished frees nothing:
// vLLM ignores an abort of a finished request, so a prefill whose client
// went away after the hand-off, or whose decode request never reaches a
// decode engine (vllm #50425), holds its KV until the timeout. This is the
// leak a router must avoid: the only prompt frees are a decode engine that
// receives the decode request and reads the KV or is aborted. The
// simulator does not model vLLM's lease extension by waiting decodes, its
// notice for a decode request refused before admission (a 400 or 404 from
// a decode engine frees nothing here), nor SGLang's bootstrap timeout for
// a decode that never connects.
//
// [Engine.HeldKV] returns the hand-offs and blocks held now,
// [Engine.HandoffsExpired] and [Engine.HandoffsAbandoned] those freed
// unread by the timeout and by an abort; /metrics has them as the gauges
// switchyard_sim_pd_handoffs_held and switchyard_sim_pd_kv_held_blocks and
// the counters switchyard_sim_pd_handoffs_expired_total and
// switchyard_sim_pd_handoffs_abandoned_total (zero on other roles).
//
// A request without the protocol's fields is refused with 400 by a PD
// engine. A failed hand-off is an *[Error] with status 500, code
// "kv_transfer_failed", matching [ErrKVTransfer]: the HTTP response, or,
// once a stream has started, an event data: {"error":{...}} followed by
// [DONE]. Regular engines ignore every PD field.
package simengine
