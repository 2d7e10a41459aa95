package agentcmd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// TestFlagsRefused: bad values of the rollout flags stop the command before
// it connects anywhere, naming the flag.
func TestFlagsRefused(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"label without value", []string{"--role", "decode", "--pd-labels", "kv="}, "--pd-labels"},
		{"label twice", []string{"--role", "prefill", "--pd-labels", "kv=a,kv=b"}, "--pd-labels"},
		{"floor above one", []string{"--slow-start-floor", "2"}, "--slow-start-floor"},
		{"negative ramp", []string{"--slow-start", "-1s"}, "--slow-start -1s"},
		{"negative keep-alive", []string{"--keepalive", "-1s"}, "--keepalive"},
		{"negative reply linger", []string{"--reply-linger", "-1ms"}, "--reply-linger"},
		{"no kv hold", []string{"--kv-hold", "0s"}, "--kv-hold"},
		{"negative sim step", []string{"--sim-batch-model", "--sim-step-time", "-1ms"}, "batch model durations"},
		{"negative engine header timeout", []string{"--engine-header-timeout", "-1s"}, "--engine-header-timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := agentcmd.Run(context.Background(), append([]string{"--engine", "sim", "--nats-url", "nats://127.0.0.1:1"}, tc.args...), cmdtest.NoEnv, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run(%v) = %v, want an error naming %s", tc.args, err, tc.want)
			}
		})
	}
}

// TestUsageListsRolloutFlags: -h documents the flags the broker side
// relies on.
func TestUsageListsRolloutFlags(t *testing.T) {
	var stderr bytes.Buffer
	if err := agentcmd.Run(context.Background(), []string{"-h"}, cmdtest.NoEnv, io.Discard, &stderr); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"--pd-labels", "--kv-hold", "--slow-start", "--slow-start-floor", "--keepalive", "--reply-linger"} {
		if !strings.Contains(stderr.String(), "  "+f+" ") {
			t.Errorf("usage lacks %s", f)
		}
	}
}

// TestSimNeverLoads: an in-process simulator that never loads keeps its
// agent warming, with the reason in its heartbeat, and it pulls nothing.
func TestSimNeverLoads(t *testing.T) {
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hbs := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe("sy.hb.>", hbs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	cmdtest.Start(t, agentcmd.Run, "--engine", "sim", "--nats-url", s.ClientURL(), "--id", "w1", "--heartbeat", "50ms", "--sim-load-time", "never")
	// Warming in every heartbeat, always with a reason; from the first
	// health check on, the engine's own.
	checked := false
	for seen := 0; seen < 5; {
		select {
		case m := <-hbs:
			hb, err := wire.UnmarshalHeartbeat(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if hb.GetState() != wire.StateWarming || hb.GetStateReason() == "" {
				t.Fatalf("heartbeat state %q, reason %q: want warming with a reason", hb.GetState(), hb.GetStateReason())
			}
			engines := strings.Contains(hb.GetStateReason(), "not healthy")
			if checked && !engines {
				t.Fatalf("heartbeat reason %q after the first health check: want the engine's", hb.GetStateReason())
			}
			if engines {
				checked = true
				seen++
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no heartbeat")
		}
	}
}

// TestProbes: the metrics listener serves /healthz at once, and /readyz
// only once the agent takes jobs: 503 with the reason while its engine
// still loads.
func TestProbes(t *testing.T) {
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b, err := broker.New(nc, broker.Config{ID: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.EnsureStream(ctx); err != nil { // the jobs stream the agent pulls from
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		loadTime  string
		wantReady int
	}{
		{name: "engine loading", loadTime: "never", wantReady: http.StatusServiceUnavailable},
		{name: "engine ready", loadTime: "0s", wantReady: http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- agentcmd.Run(ctx, []string{"--engine", "sim", "--nats-url", s.ClientURL(), "--id", "p-" + tt.loadTime,
					"--heartbeat", "50ms", "--sim-load-time", tt.loadTime, "--metrics-listen", addr}, cmdtest.NoEnv, io.Discard, io.Discard)
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			testwait.Status(t, nil, "http://"+addr+"/healthz", http.StatusOK)
			testwait.Status(t, nil, "http://"+addr+"/readyz", tt.wantReady)
			if tt.wantReady != http.StatusOK {
				resp, err := http.Get("http://" + addr + "/readyz")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.HasPrefix(string(body), "not ready: "+wire.StateWarming+": ") {
					t.Errorf("/readyz body %q: want the state and its reason", body)
				}
			}
		})
	}
}
