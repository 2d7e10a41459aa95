// Package kvevents speaks vLLM's KV-cache events: what an engine started
// with --kv-events-config publishes when it stores and evicts prefix-cache
// blocks (llm-d-inference-sim speaks it too). It is the one home of that
// format: [Encode] and [Decode] for the msgpack batches, a [Publisher] for
// the simulated engine, and a [Subscriber] for the agent, over ZeroMQ
// PUB/SUB.
//
// # Wire format (vllm/distributed/kv_events.py)
//
// The publisher binds a ZMQ PUB socket (default tcp://*:5557) and sends
// each batch as a three-frame message: the topic (default empty), the
// batch's sequence number as 8 bytes big-endian (from 0, one per batch),
// and the msgpack payload. The payload is msgspec's encoding of
// array-like structs (omit_defaults), events being tagged by class name
// as their first element:
//
//	KVEventBatch:     [ts float64, [event...], data_parallel_rank?]
//	BlockStored:      ["BlockStored", [hash...], parent_hash|nil,
//	                   [token_id...], block_size, lora_id|nil, medium|nil, ...]
//	BlockRemoved:     ["BlockRemoved", [hash...], medium|nil, ...]
//	AllBlocksCleared: ["AllBlocksCleared", ...]
//
// A block hash is an int (vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
// the low 64 bits of the block's hash) or bytes; [Decode] turns bytes
// into the same uint64 (their last 8 bytes, big-endian). Trailing fields
// newer than these (lora_name, extra keys) are skipped, and older events
// without medium decode too. The replay socket for missed batches is not
// implemented: a [Subscriber] reports a gap instead, and the consumer
// forgets what it knew of that engine.
package kvevents
