package main

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/vllmpb"
)

func TestRunServesGRPC(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	attrs, done := startRunAttrs(t, ctx,
		[]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--ttft", "0", "--itl", "0"}, nil)
	addr := attrs["grpc_addr"]
	if addr == "" {
		t.Fatalf("no grpc_addr in %v", attrs)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := vllmpb.NewVllmEngineClient(conn)
	if h, err := c.HealthCheck(t.Context(), &vllmpb.HealthCheckRequest{}); err != nil || !h.GetHealthy() {
		t.Fatalf("health %v %v", h, err)
	}
	limit := uint32(7)
	st, err := c.Generate(t.Context(), &vllmpb.GenerateRequest{
		Input:          &vllmpb.GenerateRequest_Text{Text: "Once upon a time"},
		SamplingParams: &vllmpb.SamplingParams{MaxTokens: &limit},
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	text, err := simengine.SimTokenizer().Decode(resp.GetComplete().GetOutputIds())
	if err != nil {
		t.Fatal(err)
	}
	x, err := simengine.Expect(simengine.APICompletion, []byte(`{"prompt":"Once upon a time","max_tokens":7}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(text) != x.Text {
		t.Fatalf("got %q, want %q", text, x.Text)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
