// Package vllmpb is the protobuf schema and gRPC code of vLLM's engine
// service, vllm.grpc.engine.VllmEngine, which the vllm-grpc agent adapter
// calls and the simulator serves. See vllm_engine.proto for where the
// schema comes from and what is left out.
package vllmpb

//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative common.proto vllm_engine.proto
