// Package wire holds the schema of the messages Switchyard sends over NATS:
// Job and Chunk as binary protobuf, Heartbeat as JSON (protojson with the
// proto field names) so people can read heartbeats with the nats CLI.
//
// The generated code is committed; regenerate it after editing wire.proto
// (needs protoc and protoc-gen-go v1.36.12 on PATH) with:
//
//	go generate ./wire
package wire

//go:generate protoc --go_out=. --go_opt=paths=source_relative wire.proto
