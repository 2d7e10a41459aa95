// Package loadgen is Switchyard's benchmark client: it drives an
// OpenAI-compatible streaming endpoint (Switchyard, a sim-engine, vLLM, a
// proxy in front of engines) and reports what vLLM's serving benchmark
// (benchmarks/benchmark_serving.py) reports: time to first token (TTFT),
// inter-token latency (ITL), time per output token (TPOT), end-to-end
// latency, request and token throughput, goodput under SLOs and errors by
// kind.
//
// Load is either a fixed number of closed-loop workers ([Config.Concurrency]
// alone) or Poisson arrivals at [Config.Rate] requests per second from a
// seeded RNG, optionally capped at Concurrency requests in flight. As in
// vLLM, a request capped by the concurrency limit starts its clock when it
// is sent, not when it arrived.
//
// Definitions, per request:
//
//   - TTFT: from sending the request to the first event carrying non-empty
//     content (delta.content or delta.reasoning_content for chat, text for
//     completions). A role-only first chunk does not count.
//   - ITL: every gap between two consecutive content events. All gaps of
//     all measured requests are pooled for the percentiles, as vLLM does,
//     so memory grows by 8 bytes per output token.
//   - TPOT: (e2e - TTFT) / (output tokens - 1), for requests with more
//     than one output token.
//   - E2E: from sending the request to data: [DONE].
//   - Output tokens: usage.completion_tokens when the server sends usage
//     (the request asks for it with stream_options.include_usage), else the
//     number of content events.
//
// The raw output ([WithRawOut], --raw-out) has one line per request with
// these figures, its error and, from a Switchyard broker, the route it
// took (its x-switchyard-route header). An https URL is checked against
// the system's certificate authorities, or those of [WithRootCAs]
// (--ca-file) for a broker with a private CA.
//
// Throughput is over the measured window: from sending the first measured
// (non-warm-up) request to the end of the last one. Percentiles interpolate
// linearly between closest ranks, as numpy.percentile does.
//
// # Cost of the client
//
// The generator must cost less than what it measures, so that the engine,
// not the generator, is the limit of a run. The SSE stream is read through
// a pooled oaiformat/sse reader, which allocates nothing once its buffers
// have grown, and each event is classified by a small scanner rather than
// decoded (BenchmarkStreamParse measures both per event). What remains is
// the kernel: one read per chunk when chunks arrive one by one.
// BenchmarkRun drives an in-process server as fast as it writes, to
// compare the client's share of the CPU with the server's.
package loadgen
