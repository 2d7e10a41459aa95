package cmdtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// RunFunc is a command's run function: brokercmd.Run, agentcmd.Run.
type RunFunc func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// NoEnv is a getenv for an empty environment: a command under test reads
// its flags from its arguments only.
func NoEnv(string) string { return "" }

// Buffer is an io.Writer that a command writes and a test reads at the
// same time.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Proc is a command's run function going in a goroutine.
type Proc struct {
	Out, Err *Buffer // the command's stdout and stderr

	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	err    error         // what run returned, once done is closed
}

// Start runs run with args and NoEnv in a goroutine. When the test ends
// the command is stopped, and the test fails if it returned an error; a
// failing test logs the end of the command's stderr.
func Start(t testing.TB, run RunFunc, args ...string) *Proc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proc{Out: &Buffer{}, Err: &Buffer{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		p.err = run(ctx, args, NoEnv, p.Out, p.Err)
		close(p.done)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stderr of %v:\n%s", args, Tail(p.Err.String(), 16<<10))
		}
		if err := p.Stop(t); err != nil {
			t.Errorf("command %v returned %v; stderr:\n%s", args, err, p.Err.String())
		}
	})
	return p
}

// Cancel ends the command as SIGTERM would, without waiting for it.
func (p *Proc) Cancel() { p.cancel() }

// Stop ends the command as SIGTERM would and returns what run returned.
func (p *Proc) Stop(t testing.TB) error {
	t.Helper()
	p.cancel()
	select {
	case <-p.done:
		return p.err
	case <-time.After(60 * time.Second):
		t.Fatalf("command did not stop; stderr:\n%s", p.Err.String())
		return nil
	}
}

// Exited reports, without waiting, whether the command has returned: nil
// while it runs, what it returned (or an error saying it returned nil)
// once it has.
func (p *Proc) Exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("returned nil")
		}
		return p.err
	default:
		return nil
	}
}

// Done is closed when the command has returned; Result is then what it
// returned.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Result is what the command returned, once Done is closed.
func (p *Proc) Result() error {
	<-p.done
	return p.err
}

// Tail is the last n bytes of s, from a line's start, marked as cut.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "[…]\n" + s
}

// Broker is a broker command started by StartBroker.
type Broker struct {
	*Proc
	HTTP string // base URL, http://127.0.0.1:port
	NATS string // the embedded server's client URL
	GRPC string // host:port, "" without --grpc
}

// StartBroker runs the broker command on random loopback ports, with its
// embedded NATS server in a temporary directory, 100ms heartbeats, no
// slow start and warnings only (everything with DEBUGLOGS set in the
// environment), and returns once it is ready. args follow these defaults,
// so a flag in args wins.
func StartBroker(t testing.TB, args ...string) *Broker {
	t.Helper()
	base := []string{"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--heartbeat-interval", "100ms", "--slow-start", "0", "--log-level", "warn"}
	if os.Getenv("DEBUGLOGS") != "" {
		args = append(args, "--log-level", "debug")
	}
	p := Start(t, brokercmd.Run, append(base, args...)...)
	b := &Broker{Proc: p}
	b.HTTP, b.NATS, b.GRPC = WaitBroker(t, p.Out, p.Exited)
	return b
}

var listenLine = regexp.MustCompile(`http=(\S+) nats=(\S+)(?: grpc=(\S+))?`)

// readyProbe asks a test broker's /readyz. A TLS broker has a self-signed
// certificate of the test's own: the probe only asks for the broker's
// state, so it does not check it.
var readyProbe = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // readiness probe of a test server
}

// WaitBroker waits for a broker's addresses in its output (out), then for
// its /readyz to answer 200, and returns the addresses. The listening line
// is only a sign: the broker prints it before it has made its jobs stream
// and subscribed. Ready is the state tests rely on: the stream exists, the
// broker takes requests and has heard the fleet's heartbeats for one
// interval. exited reports the command's end, if any (Proc.Exited).
func WaitBroker(t testing.TB, out fmt.Stringer, exited func() error) (httpURL, natsURL, grpcAddr string) {
	t.Helper()
	httpURL, natsURL, grpcAddr = WaitListening(t, out, exited)
	testwait.Status(t, readyProbe, httpURL+"/readyz", http.StatusOK)
	return httpURL, natsURL, grpcAddr
}

// WaitListening waits for a broker's addresses in its output (out) and
// returns them, ready or not: for tests of a broker that cannot be ready.
func WaitListening(t testing.TB, out fmt.Stringer, exited func() error) (httpURL, natsURL, grpcAddr string) {
	t.Helper()
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		if err := exited(); err != nil {
			t.Fatalf("broker exited: %v\n%s", err, out.String())
		}
		m := listenLine.FindStringSubmatch(out.String())
		if m == nil {
			return fmt.Errorf("broker not listening yet")
		}
		httpURL, natsURL, grpcAddr = m[1], m[2], m[3]
		return nil
	})
	return httpURL, natsURL, grpcAddr
}

// WaitEligible waits until every id is an eligible agent in the fleet
// view (GET /v1/fleet) of the broker at base.
func WaitEligible(t testing.TB, base string, ids ...string) {
	t.Helper()
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		var f struct {
			Agents []struct {
				ID       string `json:"id"`
				Eligible bool   `json:"eligible"`
				Reason   string `json:"reason"`
			} `json:"agents"`
		}
		resp, err := http.Get(base + "/v1/fleet")
		if err != nil {
			return err
		}
		err = json.NewDecoder(resp.Body).Decode(&f)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("GET /v1/fleet: %w", err)
		}
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

// WaitHealthy waits for an engine's /health at base to answer 200, the
// state an agent waits for before it says ready.
func WaitHealthy(t testing.TB, base string) {
	t.Helper()
	testwait.Status(t, nil, base+"/health", http.StatusOK)
}

// CloseIdleProbes closes the kept-alive connections of the readiness probe
// (WaitBroker), for tests that count a broker's open connections.
func CloseIdleProbes() { readyProbe.CloseIdleConnections() }
