// Package grpcapi is the broker's gRPC ingress: service switchyard.v1.Switchyard
// (api/switchyard/v1), plus grpc.health.v1 and server reflection. It turns
// typed requests into the OpenAI request body the broker carries, submits
// them, and relays each Call's chunks as stream messages. Broker and wire
// errors meet gRPC status codes only in errors.go.
package grpcapi
