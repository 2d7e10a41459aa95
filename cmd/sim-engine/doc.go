// Command sim-engine serves a simulated vLLM-like inference engine over HTTP
// (the OpenAI chat and completion APIs, /v1/models, /health and /metrics),
// for tests and benchmarks of Switchyard without GPUs. See package simengine
// for the deterministic output and the timing model.
//
// With --role prefill or --role decode and --pd-protocol vllm or sglang it
// is one side of a prefill/decode pair; a prefill engine also serves its
// bootstrap side channel on --bootstrap-host:--bootstrap-port (default
// 127.0.0.1:8998, 0 for any free port), logged as bootstrap_addr.
//
// --prefill-per-token adds to --ttft per prompt token, so that a long
// prompt's first token can take many seconds.
//
// --batch-model replaces that constant model (--ttft, --prefill-per-token,
// --itl) with continuous batching and chunked prefill: each engine step
// decodes one token of every running sequence and prefills up to
// --max-batched-tokens prompt tokens of the others, and lasts --step-time
// + --step-per-seq x decoding sequences + --step-per-prefill-token x
// prefilled tokens, so long prompts slow the decodes beside them. --slots
// is the engine's max-num-seqs. A decode engine's leg joins the batch
// --kv-transfer-per-token x prompt tokens after its KV was handed over.
// The defaults model Llama-3.1-8B on one H100 under vLLM; package
// simengine names their source.
//
// --load-time D (default 0) makes the engine load for D after it starts:
// it listens at once, but /health, /v1/models and the completion routes
// answer 503 (gRPC: Unavailable) until D has passed, as a vLLM or SGLang
// engine loading its weights is not ready. --load-time never makes an
// engine that never becomes healthy. The log says "loaded" when it is.
//
// --kv-hold-timeout (default 30s, vLLM NIXL's lease) is how long a prefill
// engine holds the KV of a hand-off no decode reads; /metrics reports the
// held hand-offs and blocks (switchyard_sim_pd_handoffs_held,
// switchyard_sim_pd_kv_held_blocks) and those that expired
// (switchyard_sim_pd_handoffs_expired_total).
//
// --enable-prefix-caching turns on a vLLM-like prefix cache of
// --prefix-cache-blocks (default 4096) blocks of --block-size (default 16)
// prompt words: a request's cached prefix costs no --prefill-per-token, and
// /metrics counts vllm:prefix_cache_queries_total and
// vllm:prefix_cache_hits_total (tokens). --kv-events-config takes vLLM's
// JSON ({"enable_kv_cache_events":true,"publisher":"zmq",
// "endpoint":"tcp://*:5557","topic":""}) and publishes the cache's
// BlockStored and BlockRemoved events in vLLM's format over ZMQ; the bound
// endpoint is logged as kv_events_endpoint. --kv-events-hash tokens makes
// the cache name its blocks as real vLLM does (token ids of a ChatML
// rendering, hashed with a per-process seed) and POST /tokenize answers
// as vLLM's, so that a worker-agent's --kv-events-hash vllm translation
// is exercised without a GPU; the default, broker, names blocks by the
// broker's own keys.
//
// With --grpc-listen (default empty: off) it also serves vLLM's gRPC engine
// service, vllm.grpc.engine.VllmEngine, on that address, logged as
// grpc_addr; see simengine.Engine.RegisterGRPC.
//
// Every flag can also be set through an environment variable named after it:
// SIM_ENGINE_ and the upper-cased flag name with '-' as '_' (for example
// SIM_ENGINE_ITL=5ms). Flags win over the environment.
package main
