//go:build unix

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// soak reports whether SWITCHYARD_SOAK=1 asks the fault tests to run
// longer and heavier (more rounds, more clients); see docs/operations.md.
func soak() bool { return os.Getenv("SWITCHYARD_SOAK") == "1" }

// ---- binaries and child processes ----

// buildBinary builds pkg once per test binary (cmdtest.BuildBinary).
func buildBinary(t testing.TB, pkg, name string, reuse bool) string {
	t.Helper()
	return cmdtest.BuildBinary(t, pkg, name, reuse)
}

func natsServerBinary(t testing.TB) string { return cmdtest.NATSServerBinary(t) }

// child is a command running as a separate process.
type child struct {
	cmd  *exec.Cmd
	out  *cmdtest.Buffer
	done chan struct{}
	err  error
}

func startChild(t testing.TB, bin string, args ...string) *child {
	t.Helper()
	return startChildEnv(t, bin, nil, args...)
}

// startChildEnv is startChild with env as the process's environment (nil:
// the test's).
func startChildEnv(t testing.TB, bin string, env []string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(bin, args...), out: &cmdtest.Buffer{}, done: make(chan struct{})}
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() { // as start does for commands run in-process
			t.Logf("output of %s %v:\n%s", bin, args, cmdtest.Tail(c.out.String(), 16<<10))
		}
	})
	return c
}

// signal sends sig and waits up to 30s for the process to end.
func (c *child) signal(t testing.TB, sig os.Signal) {
	t.Helper()
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit on %v; output:\n%s", c.cmd.Path, sig, c.out.String())
	}
}

// exited reports, without waiting, whether the process has ended.
func (c *child) exited() error {
	select {
	case <-c.done:
		if c.err == nil {
			return fmt.Errorf("exited with status 0")
		}
		return c.err
	default:
		return nil
	}
}

func (c *child) kill() {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// natsProc is an external nats-server process with JetStream.
type natsProc struct {
	bin  string
	port int
	dir  string
	proc *child
}

func (n *natsProc) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// startNATSProcess runs nats-server on a free loopback port with its store
// in dir.
func startNATSProcess(t testing.TB, dir string) *natsProc {
	t.Helper()
	n := &natsProc{bin: natsServerBinary(t), port: freePort(t), dir: dir}
	n.Start(t)
	return n
}

// Start (re)starts the server on its port and store.
func (n *natsProc) Start(t testing.TB) {
	t.Helper()
	n.proc = startChild(t, n.bin, "-js", "-sd", n.dir, "-p", strconv.Itoa(n.port), "-a", "127.0.0.1", "-n", "sy-ext")
	testwait.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		select {
		case <-n.proc.done:
			t.Fatalf("nats-server exited: %v\n%s", n.proc.err, n.proc.out.String())
		default:
		}
		// Ready is JetStream answering on the client port, what the broker
		// and agents need; the "Server is ready" log line is only a sign.
		nc, err := nats.Connect(n.URL(), nats.NoReconnect(), nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
}

// Stop ends the server with SIGTERM, as an operator's restart does.
func (n *natsProc) Stop(t testing.TB) { n.proc.signal(t, syscall.SIGTERM) }

// ---- the invariant checker ----

// outcome is what one streaming client received, read event by event.
type outcome struct {
	prompt    string
	maxTokens int
	status    int
	agent     string
	requestID string // the X-Request-Id the broker answered with (its logs' client_request_id)
	text      string
	done      int    // [DONE] events
	errors    int    // error events, or 1 for an HTTP error
	errMsg    string // the first error's message
	errCode   string
	protoErr  string // a malformed stream: event after the end, bad JSON, cut without an end
	start     time.Time
	firstTok  time.Time
	lastTok   time.Time
	maxGap    time.Duration // the longest wait for text: the time to the first token, or between two
	gapEnd    time.Time     // when that wait ended
	end       time.Time
	limit     time.Duration // the request's deadline, plus slack
	transport error         // the request could not be sent at all
}

// ledger sends streaming requests and checks, for every one, the
// contract: exactly one terminal outcome ([DONE] or one error, in an SSE
// event or as an HTTP status), the text equal to what the simulator
// generates for the prompt (or, for a stream ended by an error, a prefix
// of it: nothing doubled or dropped), and no request open past its
// deadline.
type ledger struct {
	mu     sync.Mutex
	all    []*outcome
	client *http.Client
	limit  time.Duration
}

// newLedger makes a ledger whose requests must end within limit.
func newLedger(limit time.Duration) *ledger {
	return &ledger{limit: limit, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}}
}

// readPause makes a slow reader: after the first event it stops reading for
// pause, then reads one event every every.
type readPause struct {
	pause, every time.Duration
}

// stream sends one streaming chat request and reads it to its end.
func (l *ledger) stream(ctx context.Context, base, prompt string, maxTokens int, slow *readPause) *outcome {
	o := &outcome{prompt: prompt, maxTokens: maxTokens, start: time.Now(), limit: l.limit}
	defer func() {
		o.end = time.Now()
		l.mu.Lock()
		l.all = append(l.all, o)
		l.mu.Unlock()
	}()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		o.transport = err
		return o
	}
	resp, err := l.client.Do(req)
	if err != nil {
		o.transport = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.agent, o.requestID = resp.StatusCode, resp.Header.Get("X-Switchyard-Agent"), resp.Header.Get("X-Request-Id")
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		o.errors = 1
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error.Code != nil {
			o.errCode = *e.Error.Code
		}
		o.errMsg = strings.TrimSpace(string(data))
		return o
	}
	br := bufio.NewReaderSize(resp.Body, 512)
	var text strings.Builder
	defer func() { o.text = text.String() }()
	events := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if o.done+o.errors == 0 {
				o.protoErr = fmt.Sprintf("stream cut without an end: %v", err)
			}
			return o
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			continue
		}
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			o.protoErr = fmt.Sprintf("not an SSE data line: %q", line)
			return o
		}
		if o.done+o.errors > 0 {
			o.protoErr = fmt.Sprintf("event after the end: %q", payload)
			return o
		}
		events++
		if slow != nil {
			if events == 1 {
				time.Sleep(slow.pause)
			} else if slow.every > 0 {
				time.Sleep(slow.every)
			}
		}
		if payload == "[DONE]" {
			o.done++
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Message string  `json:"message"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			o.protoErr = fmt.Sprintf("bad event %q: %v", payload, err)
			return o
		}
		if c.Error != nil {
			o.errors++
			o.errMsg = c.Error.Message
			if c.Error.Code != nil {
				o.errCode = *c.Error.Code
			}
			continue
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				now := time.Now()
				last := o.lastTok
				if o.firstTok.IsZero() {
					o.firstTok, last = now, o.start
				}
				if gap := now.Sub(last); gap > o.maxGap {
					o.maxGap, o.gapEnd = gap, now
				}
				o.lastTok = now
			}
			text.WriteString(ch.Delta.Content)
		}
	}
}

// tally is the ledger's summary.
type tally struct {
	total, ok, refused, failed int // refused: an HTTP error before any output
	byCode                     map[string]int
	violations                 []string
	samples                    []string // the first error messages, for the log
}

func (s tally) String() string {
	return fmt.Sprintf("%d requests: %d complete, %d refused (HTTP error), %d ended by an error event; errors by code %v; e.g. %q",
		s.total, s.ok, s.refused, s.failed, s.byCode, s.samples)
}

// summary counts outcomes so far, for progress messages.
func (l *ledger) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	done, other := 0, map[int]int{}
	for _, o := range l.all {
		if o.done == 1 {
			done++
		} else {
			other[o.status]++
		}
	}
	return fmt.Sprintf("%d ended: %d complete, others by status %v", len(l.all), done, other)
}

// check verifies every outcome and returns the summary; violations of the
// contract fail t.
func (l *ledger) check(t testing.TB) tally {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := tally{byCode: map[string]int{}}
	want := map[string]string{}
	for _, o := range l.all {
		s.total++
		bad := func(f string, args ...any) {
			s.violations = append(s.violations, fmt.Sprintf("%q: ", o.prompt)+fmt.Sprintf(f, args...))
		}
		if o.transport != nil {
			bad("request not sent: %v", o.transport)
			continue
		}
		key := fmt.Sprintf("%s\x00%d", o.prompt, o.maxTokens)
		exp, ok := want[key]
		if !ok {
			exp = expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, o.prompt, o.maxTokens)).Text
			want[key] = exp
		}
		if o.protoErr != "" {
			bad("%s", o.protoErr)
		}
		if n := o.done + o.errors; n != 1 {
			bad("%d terminal outcomes (done %d, errors %d)", n, o.done, o.errors)
		}
		switch {
		case o.done == 1 && o.text != exp:
			bad("text %q, want %q", o.text, exp)
		case o.errors > 0 && !strings.HasPrefix(exp, o.text):
			bad("text before the error %q is not a prefix of %q", o.text, exp)
		}
		if d := o.end.Sub(o.start); d > o.limit {
			bad("open %s, past its deadline %s", d.Round(time.Millisecond), o.limit)
		}
		switch {
		case o.done == 1 && o.errors == 0:
			s.ok++
		case o.status != http.StatusOK:
			s.refused++
			s.byCode[o.errCode]++
		default:
			s.failed++
			s.byCode[o.errCode]++
		}
		if o.errors > 0 && len(s.samples) < 5 {
			s.samples = append(s.samples, fmt.Sprintf("%s (after %d bytes of text)", o.errMsg, len(o.text)))
		}
	}
	for i, v := range s.violations {
		if i == 10 {
			t.Errorf("... and %d more violations", len(s.violations)-10)
			break
		}
		t.Errorf("invariant: %s", v)
	}
	return s
}

// ---- SIGKILL of an agent process ----

// waitGone polls the fleet until id is no longer eligible and returns when
// it saw that.
func waitGone(t testing.TB, base, id string) time.Time {
	t.Helper()
	var at time.Time
	testwait.For(t, 20*time.Second, 2*time.Millisecond, func() error {
		for _, a := range getFleet(t, base).Agents {
			if a.ID == id && a.Eligible {
				return fmt.Errorf("%s still eligible", id)
			}
		}
		at = time.Now()
		return nil
	})
	return at
}

// TestAgentSIGKILL: a worker-agent process killed with SIGKILL (no drain,
// no last heartbeat) while its engine is still prefilling a request; the
// broker detects the missing heartbeats and retries the request on another
// agent before the first token, invisibly to the client. Logs the
// detection time.
func TestAgentSIGKILL(t *testing.T) {
	bin := buildBinary(t, "github.com/switchyard-ai/switchyard/cmd/worker-agent", "worker-agent", false)
	b := cmdtest.StartBroker(t)
	rounds := 1
	if soak() {
		rounds = 5
	}
	l := newLedger(30 * time.Second)
	var survivor *cmdtest.Proc
	for round := range rounds {
		if survivor != nil {
			_ = survivor.Stop(t) // the doomed agent must be the only one when the request is routed
		}
		slow := startEngine(t, simengine.Config{Model: model, TTFT: 10 * time.Second, ITL: time.Millisecond, Slots: 4})
		id := fmt.Sprintf("doomed-%d", round)
		doomed := startChild(t, bin, "--nats-url", b.NATS, "--engine", "openai", "--engine-url", slow.URL, "--id", id,
			"--slots", "4", "--heartbeat", "100ms", "--log-level", "warn", "--slow-start", "0")
		cmdtest.WaitEligible(t, b.HTTP, id)
		var wg sync.WaitGroup
		var o *outcome
		wg.Add(1)
		go func() {
			defer wg.Done()
			o = l.stream(context.Background(), b.HTTP, fmt.Sprintf("outlive your agent, round %d", round), 12, nil)
		}()
		if !waitEngine(slow, 10*time.Second) {
			t.Fatal("the request did not reach the doomed agent's engine")
		}
		sid := fmt.Sprintf("survivor-%d", round)
		survivor = startAgent(t, b.NATS, sid, fastEngine(t, 4), 4)
		cmdtest.WaitEligible(t, b.HTTP, sid)
		killed := time.Now()
		if err := doomed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		gone := waitGone(t, b.HTTP, id)
		wg.Wait()
		<-doomed.done
		if o.done != 1 || o.agent != sid {
			t.Fatalf("round %d: after SIGKILL: %+v, want completion on the survivor", round, o)
		}
		t.Logf("round %d: SIGKILL -> not eligible in %s (heartbeat 100ms, 3 missed intervals); request completed %s after the kill, first token %s after it",
			round, gone.Sub(killed).Round(time.Millisecond), o.end.Sub(killed).Round(time.Millisecond), o.firstTok.Sub(killed).Round(time.Millisecond))
	}
	if s := l.check(t); s.ok != s.total {
		t.Fatalf("requests lost: %s", s)
	}
}

// scrapeValue returns the value of an unlabelled series on a /metrics
// page, "" if the page or the series is not there.
func scrapeValue(url, name string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// waitEngine reports whether e has a request running within d.
func waitEngine(e *engine, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if e.current.Load() > 0 {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// ---- rolling restart ----

// load runs closed-loop streaming clients until stop is closed.
func load(l *ledger, base string, clients, maxTokens int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				l.stream(context.Background(), base, fmt.Sprintf("client %d request %d", c, i), maxTokens, nil)
			}
		}()
	}
	return &wg
}

// TestRollingRestart: three agents under continuous streaming load from
// several clients; each is restarted in turn (drained as on SIGTERM, then
// started again with the same id and waited for until eligible). No
// request may fail.
func TestRollingRestart(t *testing.T) {
	b := cmdtest.StartBroker(t)
	const n, slots = 3, 4
	engines := make([]*engine, n)
	agents := make([]*cmdtest.Proc, n)
	ids := make([]string, n)
	// 500ms heartbeats (stale after 1.5s): the agents that are not being
	// restarted must stay live, and 100ms ones went stale under load (a
	// starved heartbeat loop), which refused requests with no_capacity. A
	// restart is seen at once either way: the draining and the ready
	// heartbeats go out when the state changes.
	run := func(i int) {
		agents[i] = startAgentCmd(t, b.NATS, "--nats-url", b.NATS, "--engine", "openai", "--engine-url", engines[i].URL, "--id", ids[i],
			"--slots", strconv.Itoa(slots), "--heartbeat", "500ms", "--log-level", "warn", "--slow-start", "0")
	}
	for i := range n {
		engines[i] = startEngine(t, simengine.Config{Model: model, TTFT: 5 * time.Millisecond, ITL: 5 * time.Millisecond, Slots: slots})
		ids[i] = fmt.Sprintf("r%d", i+1)
		run(i)
	}
	cmdtest.WaitEligible(t, b.HTTP, ids...)
	rounds, clients := 1, 6
	if soak() {
		rounds, clients = 5, 12
	}
	l := newLedger(60 * time.Second)
	stop := make(chan struct{})
	wg := load(l, b.HTTP, clients, 30, stop)
	for round := range rounds {
		for i := range n {
			time.Sleep(300 * time.Millisecond) // load on the full fleet between restarts
			at := time.Now()
			if err := agents[i].Stop(t); err != nil {
				t.Fatalf("agent %s: %v", ids[i], err)
			}
			drained := time.Since(at)
			run(i)
			cmdtest.WaitEligible(t, b.HTTP, ids[i])
			t.Logf("round %d: %s drained in %s, eligible again %s after the stop", round, ids[i], drained.Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	s := l.check(t)
	t.Logf("rolling restart: %s", s)
	if s.ok != s.total {
		t.Fatalf("failed requests during the rolling restart: %s", s)
	}
}

// ---- slow readers and broker memory ----

var metricLine = regexp.MustCompile(`(?m)^(go_memstats_heap_inuse_bytes|process_resident_memory_bytes|go_goroutines) (\S+)$`)

// brokerMemory scrapes the broker's own memory figures from /metrics.
func brokerMemory(base string) (heap, rss, goroutines float64, err error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, 0, err
	}
	for _, m := range metricLine.FindAllStringSubmatch(string(data), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		switch m[1] {
		case "go_memstats_heap_inuse_bytes":
			heap = v
		case "process_resident_memory_bytes":
			rss = v
		case "go_goroutines":
			goroutines = v
		}
	}
	return heap, rss, goroutines, nil
}

// smallWindowClient reads over sockets with a small receive buffer, so a
// client that stops reading pushes back on the broker within a few KB
// instead of the megabytes loopback autotuning allows.
func smallWindowClient() *http.Client {
	d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 2048}}
}

// TestSlowReaders: 1,000 concurrent streaming clients that stop reading
// after the first event for a while (over small socket buffers) against a
// fast engine. The broker runs as its own process so its heap and RSS are
// its alone; the figures are logged (docs/operations.md records them).
// Every client still gets exactly one terminal outcome.
func TestSlowReaders(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 streams")
	}
	bin := buildBinary(t, "github.com/switchyard-ai/switchyard/cmd/broker", "broker", false)
	clients, pause, tokens := 1000, 3*time.Second, 400
	if soak() {
		clients, pause, tokens = 2000, 10*time.Second, 1000
	}
	bp := startChild(t, bin, "--http", "127.0.0.1:0", "--grpc", "", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		// 500ms heartbeats: the agents share the test's CPUs with 1,000
		// clients under -race, and 100ms ones get starved into "stale".
		"--heartbeat-interval", "500ms", "--slow-start", "0", "--log-level", "warn", "--queue-max", "100000", "--request-timeout", "60s")
	base, natsURL, _ := cmdtest.WaitBroker(t, bp.out, bp.exited)
	const agents = 4
	ids := make([]string, agents)
	for i := range agents {
		ids[i] = fmt.Sprintf("fast%d", i)
		startAgentCmd(t, natsURL, "--nats-url", natsURL, "--engine", "sim", "--id", ids[i], "--slots", strconv.Itoa(clients/agents+1),
			"--heartbeat", "500ms", "--sim-ttft", "1ms", "--sim-itl", "1ms", "--log-level", "error", "--slow-start", "0")
	}
	cmdtest.WaitEligible(t, base, ids...)
	heap0, rss0, g0, err := brokerMemory(base)
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(70 * time.Second)
	l.client = smallWindowClient()
	var peakHeap, peakRSS, peakG float64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if h, r, g, err := brokerMemory(base); err == nil {
				peakHeap, peakRSS, peakG = max(peakHeap, h), max(peakRSS, r), max(peakG, g)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	began := time.Now()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.stream(context.Background(), base, fmt.Sprintf("slow reader %d", i), tokens, &readPause{pause: pause})
		}()
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	s := l.check(t)
	const mb = 1 << 20
	t.Logf("%d slow readers (pause %s after the first event, %d tokens each, 4 KiB socket buffers) in %s: %s",
		clients, pause, tokens, time.Since(began).Round(time.Millisecond), s)
	t.Logf("broker heap in use %.1f MiB idle -> %.1f MiB peak; RSS %.1f -> %.1f MiB; goroutines %.0f -> %.0f",
		heap0/mb, peakHeap/mb, rss0/mb, peakRSS/mb, g0, peakG)
	// A sanity bound only: what 1,000 streams of a few hundred tokens each
	// can leave waiting is far below.
	if peakHeap > 2<<30 {
		t.Fatalf("broker heap %.0f MiB", peakHeap/mb)
	}
	bp.signal(t, syscall.SIGTERM)
}
