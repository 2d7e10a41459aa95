package simengine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/openai"
	"github.com/switchyard-ai/switchyard/agent/engine/sim"
	"github.com/switchyard-ai/switchyard/agent/engine/vllmgrpc"
	"github.com/switchyard-ai/switchyard/simengine"
)

// The agent's three engine adapters, probing the engine as the agent does
// before it pulls jobs, see a loading engine as unhealthy and a loaded one
// as healthy.
func TestAdaptersSeeLoading(t *testing.T) {
	for _, tc := range []struct {
		name     string
		loadTime time.Duration
		healthy  bool
	}{
		{"loading", time.Hour, false},
		{"never", simengine.LoadNever, false},
		{"loaded", 0, true},
		{"loads", 50 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := simengine.DefaultConfig()
			cfg.LoadTime = tc.loadTime
			e, err := simengine.New(cfg, simengine.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(e.Handler())
			t.Cleanup(srv.Close)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := e.GRPCServer()
			go func() { _ = gs.Serve(ln) }()
			t.Cleanup(gs.Stop)

			httpA, err := openai.New(srv.URL, 2)
			if err != nil {
				t.Fatal(err)
			}
			grpcA, err := vllmgrpc.New(ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = grpcA.Close() })
			for name, hc := range map[string]agent.HealthChecker{
				"openai": httpA, "vllmgrpc": grpcA, "sim": sim.New(e),
			} {
				probe := func() error {
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					defer cancel()
					return hc.Health(ctx)
				}
				if !tc.healthy {
					if err := probe(); err == nil {
						t.Errorf("%s: healthy while loading", name)
					}
					continue
				}
				deadline := time.Now().Add(10 * time.Second)
				for err := probe(); err != nil; err = probe() {
					if time.Now().After(deadline) {
						t.Fatalf("%s: %v", name, fmt.Errorf("never healthy: %w", err))
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			if !tc.healthy && !errors.Is(e.Health(), simengine.ErrLoading) {
				t.Fatalf("Health %v", e.Health())
			}
		})
	}
}
