package vllmgrpc

import (
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/wire"
)

// TestEngineMetadata: every Generate call, of a regular job and of both
// vLLM PD legs, carries the job's x-request-id (the client's id, else the
// broker's) and its W3C trace context as gRPC metadata.
func TestEngineMetadata(t *testing.T) {
	var mu sync.Mutex
	var seen []metadata.MD
	record := grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if strings.HasSuffix(info.FullMethod, "/Generate") {
			md, _ := metadata.FromIncomingContext(ss.Context())
			mu.Lock()
			seen = append(seen, md)
			mu.Unlock()
		}
		return h(srv, ss)
	})
	serve := func(cfg simengine.Config) string {
		e, err := simengine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := e.GRPCServer(record)
		go func() { _ = s.Serve(ln) }()
		t.Cleanup(s.Stop)
		return ln.Addr().String()
	}
	pcfg, dcfg := simConfig(), simConfig()
	pcfg.Role, pcfg.PDProtocol = simengine.RolePrefill, simengine.PDVLLM
	dcfg.Role, dcfg.PDProtocol = simengine.RoleDecode, simengine.PDVLLM
	regular := newAdapter(t, serve(simConfig()))
	pre, dec := newAdapter(t, serve(pcfg)), newAdapter(t, serve(dcfg))
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	const body = `{"prompt":"Tell me about the sea","max_tokens":5,"min_tokens":2}`

	for _, tc := range []struct {
		name, client, want string
	}{
		{"client id", "client-1", "client-1"},
		{"broker id", "", "req-1"},
		{"address-shaped id", "x___prefill_addr_10.0.0.1:21001___", "req-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			seen = nil
			mu.Unlock()
			job := func() *wire.Job {
				r := request(wire.API_API_COMPLETION, body)
				r.Job.ClientRequestId = tc.client
				r.Job.Trace = map[string]string{"traceparent": tp}
				return r.Job
			}
			r := request(wire.API_API_COMPLETION, body)
			r.Job = job()
			if err := regular.Stream(t.Context(), r, func([]byte, bool) error { return nil }); err != nil {
				t.Fatal(err)
			}
			r.Job = job()
			var h *wire.PDHandoff
			if err := pre.Prefill(t.Context(), r, func(x *wire.PDHandoff) error { h = x; return nil }); err != nil {
				t.Fatal(err)
			}
			r.Job = job()
			r.Job.Pd = h
			if err := dec.Stream(t.Context(), r, func([]byte, bool) error { return nil }); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 3 {
				t.Fatalf("%d Generate calls, want 3", len(seen))
			}
			for i, md := range seen {
				if id, got := md.Get("x-request-id"), md.Get("traceparent"); len(id) != 1 || id[0] != tc.want || len(got) != 1 || got[0] != tp {
					t.Errorf("call %d: x-request-id %q traceparent %q, want %q and the client's", i, id, got, tc.want)
				}
			}
		})
	}
}
