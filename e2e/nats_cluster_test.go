//go:build unix

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
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
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
)

// natsNode is one nats-server process of a JetStream cluster on loopback:
// client, route and monitoring ports fixed at its first start, so a restart
// comes back where its peers and clients look for it, on its own store.
type natsNode struct {
	name               string
	bin                string
	port, cport, mport int
	dir                string
	routes             string
	proc               *child
	monitor            *http.Client
}

func (n *natsNode) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// start runs the server and waits until its monitoring port answers; the
// cluster as a whole is waited for by waitHealthy.
func (n *natsNode) start(t testing.TB) {
	t.Helper()
	n.proc = startChild(t, n.bin, "-js", "-sd", n.dir, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-n", n.name,
		"-m", strconv.Itoa(n.mport), "--cluster_name", "sy", "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", n.cport), "--routes", n.routes)
}

// kill ends the server with SIGKILL: no lame-duck mode, no leadership
// handed over, its connections cut by the kernel.
func (n *natsNode) kill(t testing.TB) {
	t.Helper()
	if err := n.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-n.proc.done
}

// healthy asks the node's /healthz: JetStream enabled and its streams and
// consumers current with their leaders.
func (n *natsNode) healthy() error {
	if err := n.proc.exited(); err != nil {
		return fmt.Errorf("%s exited: %v\n%s", n.name, err, n.proc.out.String())
	}
	resp, err := n.monitor.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz?details=true", n.mport))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// The body names what is not current: a stream, a consumer, the
		// meta layer.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return fmt.Errorf("%s /healthz: %s: %s", n.name, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// clients returns the names of the client connections on the node.
func (n *natsNode) clients() ([]string, error) {
	resp, err := n.monitor.Get(fmt.Sprintf("http://127.0.0.1:%d/connz?limit=4096", n.mport))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var cz struct {
		Connections []struct {
			Name string `json:"name"`
		} `json:"connections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cz); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(cz.Connections))
	for _, c := range cz.Connections {
		out = append(out, c.Name)
	}
	return out, nil
}

// natsCluster is three nats-server processes routed to each other.
type natsCluster struct {
	nodes []*natsNode
}

// startNATSCluster starts n nats-server processes built from the module's
// pinned nats-server and waits until every one is healthy.
func startNATSCluster(t testing.TB, n int) *natsCluster {
	t.Helper()
	bin := natsServerBinary(t)
	c := &natsCluster{}
	for i := range n {
		c.nodes = append(c.nodes, &natsNode{name: fmt.Sprintf("n%d", i), bin: bin, port: freePort(t), cport: freePort(t), mport: freePort(t),
			dir: t.TempDir(), monitor: &http.Client{Timeout: 2 * time.Second}})
	}
	var routes []string
	for _, nd := range c.nodes {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", nd.cport))
	}
	for _, nd := range c.nodes {
		nd.routes = strings.Join(routes, ",")
		nd.start(t)
	}
	c.waitHealthy(t, c.nodes...)
	return c
}

func (c *natsCluster) URLs() string {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, n.URL())
	}
	return strings.Join(urls, ",")
}

// waitHealthy waits until every node's /healthz answers 200. A node
// restarted under load catches up its streams and consumers in seconds
// here, but CI runs this beside other packages under the race detector:
// the bound is generous, and a wait past slowHealth is logged with what
// held it up (the node's own words), so a slow catch-up shows in a
// passing run too.
func (c *natsCluster) waitHealthy(t testing.TB, nodes ...*natsNode) {
	t.Helper()
	const slowHealth = 20 * time.Second
	start := time.Now()
	var last error
	testwait.For(t, 2*time.Minute, 50*time.Millisecond, func() error {
		for _, n := range nodes {
			if err := n.healthy(); err != nil {
				last = err
				return err
			}
		}
		return nil
	})
	if took := time.Since(start); took > slowHealth {
		t.Logf("cluster healthy after %s; last held up by: %v", took.Round(time.Millisecond), last)
	}
}

func (c *natsCluster) node(name string) *natsNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// connectedTo returns the nodes that hold a client connection whose name
// starts with prefix.
func (c *natsCluster) connectedTo(prefix string) []*natsNode {
	var out []*natsNode
	for _, n := range c.nodes {
		names, err := n.clients()
		if err != nil {
			continue
		}
		for _, name := range names {
			if strings.HasPrefix(name, prefix) {
				out = append(out, n)
				break
			}
		}
	}
	return out
}

// streamLeader returns the node leading the jobs stream.
func (c *natsCluster) streamLeader(t testing.TB, js jetstream.JetStream) *natsNode {
	t.Helper()
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
		if leader = c.node(info.Cluster.Leader); leader == nil {
			return fmt.Errorf("stream leader %q is not a node of the cluster", info.Cluster.Leader)
		}
		return nil
	})
	return leader
}

var brokerRequestID = regexp.MustCompile(`request_id=(\S+)`)

// consumerLeader returns the name of the node leading the regular pool's
// consumer, "" if unknown: pulls wait for its election as publishes wait
// for the stream's.
func consumerLeader(js jetstream.JetStream) string {
	name, err := subjects.ConsumerName(model, subjects.PoolRegular)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, broker.DefaultStream, name)
	if err != nil || cons.CachedInfo().Cluster == nil {
		return ""
	}
	return cons.CachedInfo().Cluster.Leader
}

// nodeLoss is one SIGKILL of the test and what clients saw around it.
type nodeLoss struct {
	kind     string // which node: the stream leader, the broker's, an agent's
	node     string
	also     string // other roles the node had
	at       time.Time
	until    time.Time // the node is back and healthy
	probes   int       // requests sent right after the kill
	pause    time.Duration
	failed   int
	requests int
	slowest  *outcome // the request that waited longest
}

// TestNATSProcessNodeLoss: three real nats-server processes in one
// JetStream cluster, the broker on all three with --replicas 3, three
// agents in front of sim-engines, closed-loop streaming clients. In turn,
// and for several rounds, a node is killed with SIGKILL: the one leading
// the jobs stream, the one the broker is connected to, and one an agent is
// connected to; then it is restarted on its store. Requests are also sent
// right after each kill, during the stream leader's election. Every
// request must complete, byte-exact: chunks lost with the node are
// repaired by retry or migration, and publishes ride out the election and
// the reconnect. The longest pause a client saw (the first token after the
// kill, or the gap in a stream) and the failures per kind of loss are
// logged (docs/operations.md).
func TestNATSProcessNodeLoss(t *testing.T) {
	c := startNATSCluster(t, 3)
	// Info logs: the line of each request (attempts, migrations) is
	// shown for the longest pause of each loss.
	b := cmdtest.StartBroker(t, "--nats-url", c.URLs(), "--replicas", "3", "--request-timeout", "60s", "--heartbeat-interval", "250ms", "--log-level", "info")
	const agents, slots = 3, 8
	ids := make([]string, agents)
	for i := range agents {
		e := startEngine(t, simengine.Config{Model: model, TTFT: 20 * time.Millisecond, ITL: 25 * time.Millisecond, Slots: slots})
		ids[i] = fmt.Sprintf("k%d", i)
		startAgent(t, c.URLs(), ids[i], e, slots, "--heartbeat", "250ms")
	}
	cmdtest.WaitEligible(t, b.HTTP, ids...)

	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	rounds, clients, tokens := 2, 12, 60
	if soak() {
		rounds, clients = 5, 24
	}
	l := newLedger(65 * time.Second)
	stop := make(chan struct{})
	loadDone := load(l, b.HTTP, clients, tokens, stop)
	var probes sync.WaitGroup
	var losses []*nodeLoss
	for round := range rounds {
		for _, kind := range []string{"stream leader", "broker's node", "an agent's node"} {
			time.Sleep(time.Second) // streams in flight on every agent
			leader := c.streamLeader(t, js)
			brokerOn := c.connectedTo("switchyard-broker")
			var victim *natsNode
			switch kind {
			case "stream leader":
				victim = leader
			case "broker's node":
				if len(brokerOn) == 0 {
					t.Fatal("no node holds the broker's connection")
				}
				victim = brokerOn[0]
			default:
				// Prefer a node with agents that is neither the broker's
				// nor the leader, so each kind of loss is seen alone.
				on := c.connectedTo("switchyard-agent-")
				if len(on) == 0 {
					t.Fatal("no node holds an agent's connection")
				}
				victim = on[0]
				for _, n := range on {
					if n != leader && (len(brokerOn) == 0 || n != brokerOn[0]) {
						victim = n
						break
					}
				}
			}
			loss := &nodeLoss{kind: kind, node: victim.name}
			var also []string
			if victim == leader && kind != "stream leader" {
				also = append(also, "stream leader")
			}
			if len(brokerOn) > 0 && victim == brokerOn[0] && kind != "broker's node" {
				also = append(also, "broker's node")
			}
			if consumerLeader(js) == victim.name {
				also = append(also, "consumer leader")
			}
			loss.also = strings.Join(also, ", ")
			loss.at = time.Now()
			victim.kill(t)
			// Requests sent during the election and the reconnects: each
			// must be served, not refused.
			for i := range 6 {
				loss.probes++
				probes.Add(1)
				go func() {
					defer probes.Done()
					l.stream(context.Background(), b.HTTP, fmt.Sprintf("round %d %s probe %d", round, kind, i), 20, nil)
				}()
				time.Sleep(500 * time.Millisecond)
			}
			// A new leader of the jobs stream, then the node back, and the
			// fleet serving again before the next loss: each loss is
			// measured from a settled cluster.
			c.streamLeader(t, js)
			victim.start(t)
			c.waitHealthy(t, c.nodes...)
			cmdtest.WaitEligible(t, b.HTTP, ids...)
			waitServes(t, l, b.HTTP, fmt.Sprintf("round %d after %s", round, kind))
			loss.until = time.Now()
			losses = append(losses, loss)
			t.Logf("round %d: %s %s killed (%s), back in %s; %s", round, kind, victim.name, loss.also,
				loss.until.Sub(loss.at).Round(time.Millisecond), l.summary())
		}
	}
	time.Sleep(time.Second)
	close(stop)
	loadDone.Wait()
	probes.Wait()

	s := l.check(t)
	// Per loss: the requests open at the kill or sent until the next one,
	// and the failures among them; the longest wait for text (the first
	// token, or a gap in a stream), each wait counted for the first loss
	// within it, or else for the last loss before it.
	l.mu.Lock()
	for i, loss := range losses {
		next := time.Now()
		if i+1 < len(losses) {
			next = losses[i+1].at
		}
		for _, o := range l.all {
			if o.end.Before(loss.at) || !o.start.Before(next) {
				continue
			}
			loss.requests++
			if o.done != 1 || o.errors != 0 {
				loss.failed++
			}
		}
	}
	for _, o := range l.all {
		if o.gapEnd.IsZero() {
			continue
		}
		began := o.gapEnd.Add(-o.maxGap)
		var owner *nodeLoss
		for _, loss := range losses {
			if loss.at.After(o.gapEnd) {
				break
			}
			owner = loss
			if !loss.at.Before(began) {
				break // the first loss within the wait
			}
		}
		if owner != nil && o.maxGap > owner.pause {
			owner.pause, owner.slowest = o.maxGap, o
		}
	}
	l.mu.Unlock()
	for _, loss := range losses {
		role := loss.kind
		if loss.also != "" {
			role += " (also " + loss.also + ")"
		}
		t.Logf("node loss: %-58s %s: longest pause %6s, %d of %d requests failed (%d sent during the election)",
			role, loss.node, loss.pause.Round(time.Millisecond), loss.failed, loss.requests, loss.probes)
		if o := loss.slowest; o != nil {
			kind := "a gap in its stream"
			if o.gapEnd.Equal(o.firstTok) {
				kind = "its first token"
			}
			t.Logf("    longest: %q sent %s after the kill, waited %s for %s, ending %s after the kill",
				o.prompt, o.start.Sub(loss.at).Round(time.Millisecond), o.maxGap.Round(time.Millisecond), kind, o.gapEnd.Sub(loss.at).Round(time.Millisecond))
			if o.requestID != "" {
				// The broker's id of the request, then its every line.
				logs := strings.Split(b.Err.String(), "\n")
				id := o.requestID
				for _, line := range logs {
					if m := brokerRequestID.FindStringSubmatch(line); m != nil && strings.Contains(line, o.requestID) {
						id = m[1]
					}
				}
				for _, line := range logs {
					if strings.Contains(line, id) {
						t.Logf("    broker: %s", line)
					}
				}
			}
		}
	}
	t.Logf("node losses: %s", s)
	if s.ok != s.total {
		t.Errorf("requests failed across the node losses: %s", s)
	}
}
