//go:build unix

package batchfaults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

const model = "sim-model"

// child is a command running as a separate process, killed at the end of
// the test if still running.
type child struct {
	cmd  *exec.Cmd
	out  *cmdtest.Buffer
	done chan struct{}
	err  error
}

func startChild(t *testing.T, bin string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(bin, args...), out: &cmdtest.Buffer{}, done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("output of %s %v:\n%s", bin, args, cmdtest.Tail(c.out.String(), 8<<10))
		}
	})
	return c
}

// kill ends the process with SIGKILL: no drain, no last heartbeat, its
// connections cut by the kernel.
func (c *child) kill() {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// binDir holds this test binary's own build of the worker-agent: the
// shared one of cmdtest.BuildBinary may be rebuilt meanwhile from another
// checkout.
var (
	binDir   string
	agentBin = sync.OnceValues(func() (string, error) {
		path := filepath.Join(binDir, "worker-agent")
		out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", path, "github.com/switchyard-ai/switchyard/cmd/worker-agent").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go build worker-agent: %v\n%s", err, out)
		}
		return path, nil
	})
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "batchfaults-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// startAgent runs a worker-agent process with its built-in simulator.
func startAgent(t *testing.T, natsURL, id string, args ...string) *child {
	t.Helper()
	bin, err := agentBin()
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--nats-url", natsURL, "--engine", "sim", "--id", id, "--slots", "8", "--heartbeat", "250ms",
		"--slow-start", "0", "--log-level", "warn", "--sim-ttft", "20ms", "--sim-itl", "10ms"}
	return startChild(t, bin, append(base, args...)...)
}

// batchInput is n chat lines with custom_ids "line-<i>", each answer about
// tokens tokens long.
func batchInput(n, tokens int) []byte {
	var b bytes.Buffer
	for i := range n {
		line, _ := json.Marshal(map[string]any{
			"custom_id": fmt.Sprintf("line-%d", i), "method": "POST", "url": "/v1/chat/completions",
			"body": map[string]any{"model": model, "max_tokens": tokens, "messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("line %d of the batch", i)}}},
		})
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// batchObject is the part of OpenAI's batch object the tests read.
type batchObject struct {
	ID            string  `json:"id"`
	Status        string  `json:"status"`
	OutputFileID  *string `json:"output_file_id"`
	ErrorFileID   *string `json:"error_file_id"`
	RequestCounts struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
	Errors json.RawMessage `json:"errors"`
}

var client = &http.Client{Timeout: 30 * time.Second}

// call sends a request and decodes a 200 answer's JSON into out; any other
// status is an error with the body.
func call(method, url, ctype string, body io.Reader, out any) error {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// submit uploads input through the Files API and creates a batch of it.
func submit(t *testing.T, base string, input []byte) string {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "lines.jsonl")
	_, _ = fw.Write(input)
	_ = mw.Close()
	var file struct {
		ID string `json:"id"`
	}
	if err := call(http.MethodPost, base+"/v1/files", mw.FormDataContentType(), &body, &file); err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(map[string]any{"input_file_id": file.ID, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
	var b batchObject
	if err := call(http.MethodPost, base+"/v1/batches", "application/json", bytes.NewReader(req), &b); err != nil {
		t.Fatal(err)
	}
	return b.ID
}

// get reads batch id, retrying through a broker's brief unavailability
// (a NATS node's loss) up to total.
func get(t *testing.T, base, id string, total time.Duration) batchObject {
	t.Helper()
	var b batchObject
	testwait.For(t, total, 100*time.Millisecond, func() error {
		return call(http.MethodGet, base+"/v1/batches/"+id, "", nil, &b)
	})
	return b
}

// waitProgress waits until at least n lines of batch id are done: the
// fault then strikes a batch in the middle.
func waitProgress(t *testing.T, base, id string, n int) batchObject {
	t.Helper()
	var b batchObject
	testwait.For(t, 60*time.Second, 50*time.Millisecond, func() error {
		b = get(t, base, id, 10*time.Second)
		if done := b.RequestCounts.Completed + b.RequestCounts.Failed; done < n {
			return fmt.Errorf("batch %s: %s, %d of %d lines done", id, b.Status, done, b.RequestCounts.Total)
		}
		if b.Status != "in_progress" {
			return fmt.Errorf("batch %s is %s, not in progress: too fast for the test", id, b.Status)
		}
		return nil
	})
	return b
}

// waitEnded waits until batch id has ended and returns it.
func waitEnded(t *testing.T, base, id string, total time.Duration) batchObject {
	t.Helper()
	var b batchObject
	testwait.For(t, total, 200*time.Millisecond, func() error {
		b = get(t, base, id, 10*time.Second)
		if !slices.Contains([]string{"completed", "failed", "expired", "cancelled"}, b.Status) {
			return fmt.Errorf("batch %s: %s, %d completed, %d failed of %d", id, b.Status, b.RequestCounts.Completed, b.RequestCounts.Failed, b.RequestCounts.Total)
		}
		return nil
	})
	return b
}

// resultLine is a line of a batch's output or error file.
type resultLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func fileLines(t *testing.T, base string, id *string) []resultLine {
	t.Helper()
	if id == nil || *id == "" {
		return nil
	}
	resp, err := client.Get(base + "/v1/files/" + *id + "/content")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("file %s: %s: %s", *id, resp.Status, b)
	}
	var out []resultLine
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var l resultLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("file %s line %d: %v", *id, len(out)+1, err)
		}
		out = append(out, l)
	}
	return out
}

// checkExactlyOnce checks that batch b completed and that each of its n
// custom_ids appears exactly once across its output and error files, and
// that the counts agree with the files.
func checkExactlyOnce(t *testing.T, base string, b batchObject, n int) {
	t.Helper()
	if b.Status != "completed" {
		t.Fatalf("batch %s ended %s (errors %s), want completed", b.ID, b.Status, b.Errors)
	}
	out, errs := fileLines(t, base, b.OutputFileID), fileLines(t, base, b.ErrorFileID)
	seen := map[string]int{}
	for _, l := range append(slices.Clone(out), errs...) {
		seen[l.CustomID]++
	}
	var missing, doubled []string
	for i := range n {
		id := "line-" + strconv.Itoa(i)
		switch seen[id] {
		case 0:
			missing = append(missing, id)
		case 1:
		default:
			doubled = append(doubled, fmt.Sprintf("%s×%d", id, seen[id]))
		}
		delete(seen, id)
	}
	if len(missing) > 0 || len(doubled) > 0 || len(seen) > 0 {
		t.Fatalf("batch %s: missing %v, doubled %v, unknown %v", b.ID, missing, doubled, seen)
	}
	for _, l := range out {
		if l.Response == nil || l.Response.StatusCode != http.StatusOK {
			t.Errorf("output line %s: %+v, want a 200 response", l.CustomID, l.Response)
		}
	}
	for _, l := range errs {
		t.Logf("error line %s: %+v %+v", l.CustomID, l.Response, l.Error)
	}
	c := b.RequestCounts
	if c.Total != n || c.Completed+c.Failed != n || c.Completed != len(out) || c.Failed != len(errs) {
		t.Errorf("request_counts %+v against %d lines, %d output and %d error lines", c, n, len(out), len(errs))
	}
}

// TestBatchAgentSIGKILL: two worker-agent processes run a batch's lines;
// one is killed with SIGKILL while it holds lines. The lines it held run
// again on the other agent, and the batch completes with every custom_id
// exactly once.
func TestBatchAgentSIGKILL(t *testing.T) {
	t.Parallel()
	b := cmdtest.StartBroker(t, "--heartbeat-interval", "250ms")
	doomed := startAgent(t, b.NATS, "doomed")
	startAgent(t, b.NATS, "survivor")
	cmdtest.WaitEligible(t, b.HTTP, "doomed", "survivor")

	nc, err := nats.Connect(b.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hbs, err := nc.SubscribeSync(subjects.DefaultPrefix + ".hb.*.*.doomed")
	if err != nil {
		t.Fatal(err)
	}

	const lines = 300
	id := submit(t, b.HTTP, batchInput(lines, 40))
	before := waitProgress(t, b.HTTP, id, lines/5)
	// The doomed agent's last heartbeat before the kill says it holds
	// batch jobs: their lines must run again elsewhere.
	held := 0
	testwait.For(t, 30*time.Second, time.Millisecond, func() error {
		m, err := hbs.NextMsg(5 * time.Second)
		if err != nil {
			return err
		}
		hb, err := wire.UnmarshalHeartbeat(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if held = int(hb.GetBatchActive()); held == 0 {
			return errors.New("the doomed agent holds no batch job")
		}
		return nil
	})
	killed := time.Now()
	doomed.kill()
	end := waitEnded(t, b.HTTP, id, 90*time.Second)
	t.Logf("agent SIGKILL holding %d batch jobs, %d of %d lines done; batch %s %s after the kill", held, before.RequestCounts.Completed+before.RequestCounts.Failed, lines,
		end.Status, time.Since(killed).Round(time.Millisecond))
	checkExactlyOnce(t, b.HTTP, end, lines)
}

// natsNode is one nats-server process of a JetStream cluster on loopback.
type natsNode struct {
	name               string
	port, cport, mport int
	proc               *child
}

func (n *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// startCluster starts three nats-server processes routed to each other
// and waits until each reports itself healthy.
func startCluster(t *testing.T) []*natsNode {
	t.Helper()
	bin := cmdtest.NATSServerBinary(t)
	nodes := make([]*natsNode, 3)
	var routes []string
	for i := range nodes {
		nodes[i] = &natsNode{name: fmt.Sprintf("n%d", i), port: freePort(t), cport: freePort(t), mport: freePort(t)}
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", nodes[i].cport))
	}
	for _, n := range nodes {
		n.proc = startChild(t, bin, "-js", "-sd", t.TempDir(), "-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-n", n.name,
			"-m", strconv.Itoa(n.mport), "--cluster_name", "sy", "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", n.cport),
			"--routes", strings.Join(routes, ","))
	}
	mon := &http.Client{Timeout: 2 * time.Second}
	testwait.For(t, 60*time.Second, 50*time.Millisecond, func() error {
		for _, n := range nodes {
			resp, err := mon.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.mport))
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", n.name, resp.Status)
			}
		}
		return nil
	})
	return nodes
}

// streamLeader returns the node leading the jobs stream.
func streamLeader(t *testing.T, nodes []*natsNode, urls string) *natsNode {
	t.Helper()
	nc, err := nats.Connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var leader *natsNode
	testwait.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, broker.DefaultStream)
		if err != nil {
			return err
		}
		info := st.CachedInfo()
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return fmt.Errorf("stream %s has no leader", broker.DefaultStream)
		}
		if len(info.Cluster.Replicas)+1 != len(nodes) {
			return fmt.Errorf("stream %s has %d replicas, want %d", broker.DefaultStream, len(info.Cluster.Replicas)+1, len(nodes))
		}
		for _, n := range nodes {
			if n.name == info.Cluster.Leader {
				leader = n
				return nil
			}
		}
		return fmt.Errorf("stream leader %q is not a node of the cluster", info.Cluster.Leader)
	})
	return leader
}

// TestBatchNATSNodeLoss: a 3-node JetStream cluster of nats-server
// processes, the broker on all three with --replicas 3 (the jobs stream,
// the batches' KV and Object Store replicated), two agents. Mid-batch the
// node leading the jobs stream is killed with SIGKILL and stays
// down: the batch completes on the other two with every custom_id exactly
// once.
func TestBatchNATSNodeLoss(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.url())
	}
	all := strings.Join(urls, ",")
	b := cmdtest.StartBroker(t, "--nats-url", all, "--replicas", "3", "--heartbeat-interval", "250ms", "--request-timeout", "60s")
	startAgent(t, all, "a1")
	startAgent(t, all, "a2")
	cmdtest.WaitEligible(t, b.HTTP, "a1", "a2")

	const lines = 300
	id := submit(t, b.HTTP, batchInput(lines, 40))
	before := waitProgress(t, b.HTTP, id, lines/5)
	victim := streamLeader(t, nodes, all)
	killed := time.Now()
	victim.proc.kill()
	end := waitEnded(t, b.HTTP, id, 120*time.Second)
	t.Logf("node %s (jobs stream leader) SIGKILL at %d of %d lines done; batch %s %s after the kill", victim.name,
		before.RequestCounts.Completed+before.RequestCounts.Failed, lines, end.Status, time.Since(killed).Round(time.Millisecond))
	checkExactlyOnce(t, b.HTTP, end, lines)
}
