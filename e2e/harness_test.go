package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// engine is a sim-engine on a loopback port that also records the most
// requests it ever ran at once.
type engine struct {
	*simengine.Engine
	URL     string
	current atomic.Int32
	peak    atomic.Int32
	served  atomic.Int32
	// finished counts the requests it answered to their end ("[DONE]");
	// an aborted one never gets there.
	finished atomic.Int32
	// Stop kills the engine: its listener and connections close at once.
	Stop func()
}

func startEngine(t testing.TB, cfg simengine.Config) *engine {
	t.Helper()
	se, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{Engine: se}
	h := se.Handler()
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path == "/tokenize" {
			// An agent's tokenize call (--kv-events-hash vllm) runs beside
			// its job: not a request served.
			h.ServeHTTP(w, r)
			return
		}
		n := e.current.Add(1)
		e.served.Add(1)
		for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
		}
		cw := &countingWriter{ResponseWriter: w, e: e}
		defer cw.end()
		h.ServeHTTP(cw, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: counting}
	go func() { _ = srv.Serve(ln) }()
	e.Stop = func() { _ = srv.Close(); _ = se.Close() }
	t.Cleanup(e.Stop)
	e.URL = "http://" + ln.Addr().String()
	cmdtest.WaitHealthy(t, e.URL)
	return e
}

// countingWriter ends a request's count just before "[DONE]" goes out: the
// client (the agent) can only start its next request after reading it, so
// the peak is exact, not inflated by handlers still returning.
type countingWriter struct {
	http.ResponseWriter
	e     *engine
	ended bool
}

func (c *countingWriter) end() {
	if !c.ended {
		c.ended = true
		c.e.current.Add(-1)
	}
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("[DONE]")) {
		c.e.finished.Add(1)
		c.end()
	}
	return c.ResponseWriter.Write(p)
}

func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

var (
	agentRun  = agentcmd.Run
	brokerRun = brokercmd.Run
)

// liveHeartbeat is the heartbeat interval of test agents that must stay
// live through a test: the broker calls an agent stale after three missed
// intervals, and on a busy 2-core machine under -race a whole test process
// (agents, embedded NATS and broker alike) was seen to stall for 650ms and
// a heartbeat to arrive 400ms late, which 100ms heartbeats (stale after
// 300ms) did not survive. 500ms ones survive 1.5s. State changes (ready,
// draining) are sent at once whatever the interval; only agents a test
// kills to see them go stale heartbeat faster.
const liveHeartbeat = "500ms"

// liveHeartbeatJSON is liveHeartbeat as a heartbeat's JSON encoding says it.
const liveHeartbeatJSON = "0.500s"

// startAgent runs the worker-agent command against an engine and returns
// once the agent is ready.
func startAgent(t testing.TB, natsURL, id string, e *engine, slots int, args ...string) *cmdtest.Proc {
	t.Helper()
	base := []string{"--nats-url", natsURL, "--engine", "openai", "--engine-url", e.URL, "--id", id,
		"--slots", fmt.Sprint(slots), "--heartbeat", liveHeartbeat, "--log-level", "warn",
		// The broker runs with --slow-start 0; agents ramp by the same rule.
		"--slow-start", "0"}
	if os.Getenv("DEBUGLOGS") != "" {
		base = append(base, "--log-level", "debug")
	}
	return startAgentCmd(t, natsURL, append(base, args...)...)
}

// startAgentCmd runs the worker-agent command with args as given (they
// name its --id) and returns once the agent is ready.
func startAgentCmd(t testing.TB, natsURL string, args ...string) *cmdtest.Proc {
	t.Helper()
	p := cmdtest.Start(t, agentcmd.Run, args...)
	waitAgent(t, natsURL, argValue(args, "--prefix", subjects.DefaultPrefix), argValue(args, "--id", ""), p.Exited, p.Err)
	return p
}

// argValue is the value of the last flag name in args, as the flag
// package reads it, or def.
func argValue(args []string, name, def string) string {
	v := def
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			v = args[i+1]
		}
	}
	return v
}

// waitAgent waits for agent id's own heartbeat to say "ready": it has
// bound its pool's consumer and pulls jobs. Its startup log line and its
// first heartbeat (warming) come earlier and are only signs of that. A
// broker's eligibility is the broker's view; tests that route through a
// broker still wait for it with cmdtest.WaitEligible.
func waitAgent(t testing.TB, natsURL, prefix, id string, exited func() error, log fmt.Stringer) {
	t.Helper()
	if id == "" {
		t.Fatal("waitAgent: the agent has no --id")
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subj, err := subjects.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	if _, err := nc.Subscribe(subj.HeartbeatsAll(), func(m *nats.Msg) {
		hb, err := wire.UnmarshalHeartbeat(m.Data)
		if err == nil && hb.GetAgentId() == id && hb.GetState() == wire.StateReady {
			ready.Store(true)
		}
	}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		if err := exited(); err != nil {
			t.Fatalf("agent %s exited: %v\n%s", id, err, log.String())
		}
		if !ready.Load() {
			return fmt.Errorf("agent %s has not said ready", id)
		}
		return nil
	})
}

// fleet is the part of GET /v1/fleet the tests read.
type fleet struct {
	Agents []struct {
		ID       string `json:"id"`
		Model    string `json:"model"`
		Pool     string `json:"pool"`
		State    string `json:"state"`
		Slots    int    `json:"slots"`
		Active   int    `json:"active"`
		Eligible bool   `json:"eligible"`
		Reason   string `json:"reason"`
		// StateReason is the agent's own word on why it does not serve.
		StateReason string `json:"state_reason"`
		// LastHeartbeat is when the broker last heard the agent.
		LastHeartbeat time.Time `json:"last_heartbeat"`
	} `json:"agents"`
}

// fleetFull adds the per-model view.
type fleetFull struct {
	Models []struct {
		Model string             `json:"model"`
		Share map[string]float64 `json:"share"`
		Queue map[string]int     `json:"queue"`
	} `json:"models"`
	Agents []struct {
		ID             string    `json:"id"`
		Pool           string    `json:"pool"`
		Active         int       `json:"active"`
		EffectiveSlots float64   `json:"effective_slots"`
		ReadySince     time.Time `json:"ready_since"`
	} `json:"agents"`
}

func getFleetFull(t testing.TB, base string) fleetFull {
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		t.Error(err)
		return fleetFull{}
	}
	defer resp.Body.Close()
	var f fleetFull
	_ = json.NewDecoder(resp.Body).Decode(&f)
	return f
}

func getFleet(t testing.TB, base string) fleet {
	t.Helper()
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var f fleet
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		t.Fatal(err)
	}
	return f
}

func simengineConfig(model string) simengine.Config {
	return simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4}
}

func withResponse(dst **http.Response) option.RequestOption { return option.WithResponseInto(dst) }

func grpcInsecure() grpc.DialOption { return grpc.WithTransportCredentials(insecure.NewCredentials()) }
