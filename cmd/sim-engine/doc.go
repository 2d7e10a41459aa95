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
// With --grpc-listen (default empty: off) it also serves vLLM's gRPC engine
// service, vllm.grpc.engine.VllmEngine, on that address, logged as
// grpc_addr; see simengine.Engine.RegisterGRPC.
//
// Every flag can also be set through an environment variable named after it:
// SIM_ENGINE_ and the upper-cased flag name with '-' as '_' (for example
// SIM_ENGINE_ITL=5ms). Flags win over the environment.
package main
