package grpcapi

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// serve starts srv on a real gRPC server on a loopback port and returns a
// client connection to it; both end with the test.
func serve(t *testing.T, srv *Server, cfg Config) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// WaitForHandlers: Stop returns only after every handler has closed its
	// Call, so each engine request is cancelled before the agent stops.
	gs := grpc.NewServer(append(ServerOptions(cfg), grpc.WaitForHandlers(true))...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return conn
}
