// Package switchyardv1 is the client-facing gRPC API of the Switchyard
// broker (service switchyard.v1.Switchyard), served by ingress/grpcapi.
//
// The generated code is committed; regenerate it after editing
// switchyard.proto (needs protoc, protoc-gen-go v1.36.12 and
// protoc-gen-go-grpc on PATH) with:
//
//	go generate ./api/switchyard/v1
package switchyardv1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative switchyard.proto
