package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/simengine"
)

// checkFor polls f every interval until it returns nil or total passes, as
// nats-server's tests do; tests wait for eventual state, never sleep.
func checkFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(every)
	}
	t.Fatalf("condition not met after %s: %v", total, err)
}

// syncBuffer is an io.Writer safe for a command's output and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func noEnv(string) string { return "" }

// engine is a sim-engine on a loopback port that also records the most
// requests it ever ran at once.
type engine struct {
	*simengine.Engine
	URL     string
	current atomic.Int32
	peak    atomic.Int32
	served  atomic.Int32
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
		if r.Method != http.MethodPost {
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
		c.end()
	}
	return c.ResponseWriter.Write(p)
}

func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// proc is a command's run function going in a goroutine.
type proc struct {
	cancel context.CancelFunc
	done   chan error
	out    *syncBuffer
	errs   *syncBuffer
}

// Stop ends the command as SIGTERM would and returns what run returned.
func (p *proc) Stop(t testing.TB) error {
	t.Helper()
	p.cancel()
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("command did not stop; stderr:\n%s", p.errs.String())
		return nil
	}
}

func start(t testing.TB, run func(context.Context, []string, func(string) string, io.Writer, io.Writer) error, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{cancel: cancel, done: make(chan error, 1), out: &syncBuffer{}, errs: &syncBuffer{}}
	go func() { p.done <- run(ctx, args, noEnv, p.out, p.errs) }()
	t.Cleanup(func() {
		if os.Getenv("DEBUGLOGS") != "" && t.Failed() {
			t.Logf("stderr of %v:\n%s", args, p.errs.String())
		}
		if err := p.Stop(t); err != nil {
			t.Errorf("command %v returned %v; stderr:\n%s", args, err, p.errs.String())
		}
	})
	return p
}

type brokerProc struct {
	*proc
	HTTP string // base URL, http://127.0.0.1:port
	NATS string
	GRPC string // host:port
}

var listenLine = regexp.MustCompile(`http=(\S+) nats=(\S+)(?: grpc=(\S+))?`)

// startBroker runs the broker command on random ports; extra args follow
// the defaults of a test broker.
func startBroker(t testing.TB, args ...string) *brokerProc {
	t.Helper()
	base := []string{"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--heartbeat-interval", "100ms", "--slow-start", "0", "--log-level", "warn"}
	if os.Getenv("DEBUGLOGS") != "" {
		args = append(args, "--log-level", "debug")
	}
	p := start(t, brokercmd.Run, append(base, args...)...)
	b := &brokerProc{proc: p}
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("broker exited: %v\n%s", err, p.errs.String())
		default:
		}
		m := listenLine.FindStringSubmatch(p.out.String())
		if m == nil {
			return fmt.Errorf("broker not listening yet")
		}
		b.HTTP, b.NATS, b.GRPC = m[1], m[2], m[3]
		return nil
	})
	return b
}

// startAgent runs the worker-agent command against an engine.
var (
	agentRun  = agentcmd.Run
	brokerRun = brokercmd.Run
)

func startAgent(t testing.TB, natsURL, id string, e *engine, slots int, args ...string) *proc {
	t.Helper()
	base := []string{"--nats-url", natsURL, "--engine", "openai", "--engine-url", e.URL, "--id", id,
		"--slots", fmt.Sprint(slots), "--heartbeat", "100ms", "--log-level", "warn",
		// The broker runs with --slow-start 0; agents ramp by the same rule.
		"--slow-start", "0"}
	if os.Getenv("DEBUGLOGS") != "" {
		base = append(base, "--log-level", "debug")
	}
	return start(t, agentcmd.Run, append(base, args...)...)
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
		ID             string  `json:"id"`
		Pool           string  `json:"pool"`
		Active         int     `json:"active"`
		EffectiveSlots float64 `json:"effective_slots"`
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

// waitEligible waits until every id is an eligible agent in the fleet view.
func waitEligible(t testing.TB, base string, ids ...string) {
	t.Helper()
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		f := getFleet(t, base)
		for _, id := range ids {
			ok := false
			for _, a := range f.Agents {
				if a.ID == id && a.Eligible {
					ok = true
				}
			}
			if !ok {
				return fmt.Errorf("agent %s not eligible in %+v", id, f.Agents)
			}
		}
		return nil
	})
}

func simengineConfig(model string) simengine.Config {
	return simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4}
}

func withResponse(dst **http.Response) option.RequestOption { return option.WithResponseInto(dst) }

func grpcInsecure() grpc.DialOption { return grpc.WithTransportCredentials(insecure.NewCredentials()) }
