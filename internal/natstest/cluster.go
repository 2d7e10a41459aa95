package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Cluster is a JetStream cluster of embedded servers on loopback, in the
// manner of nats-server's createJetStreamClusterExplicit: every server has
// its own store in a test temp dir and routes to all the others, and
// client and route ports are chosen up front so a stopped server restarts
// on the same addresses with the same store.
type Cluster struct {
	t       testing.TB
	Name    string
	Servers []*server.Server
	Opts    []*server.Options
}

// FreePort returns a loopback TCP port that was free a moment ago (listen
// on :0 and close). Another process may take it in between, which tests
// accept.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// RunCluster starts n JetStream servers named <name>-0 .. <name>-n-1 as one
// cluster, waits until they have elected a meta leader and all are
// current, and shuts them down at test cleanup.
func RunCluster(t testing.TB, name string, n int) *Cluster {
	t.Helper()
	return RunClusterWith(t, name, n, nil)
}

// RunClusterWith is RunCluster with configure applied to each server's
// options before it starts (nil: none), e.g. JetStream limits.
func RunClusterWith(t testing.TB, name string, n int, configure func(*server.Options)) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Name: name}
	routes := make([]string, n)
	clusterPorts := make([]int, n)
	for i := range n {
		clusterPorts[i] = FreePort(t)
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", clusterPorts[i])
	}
	for i := range n {
		o := DefaultOptions(t)
		o.ServerName = fmt.Sprintf("%s-%d", name, i)
		o.Port = FreePort(t)
		o.Cluster = server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: clusterPorts[i]}
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		if configure != nil {
			configure(o)
		}
		c.Opts = append(c.Opts, o)
	}
	c.Servers = make([]*server.Server, n)
	for i := range n {
		c.start(i)
	}
	t.Cleanup(func() {
		for _, s := range c.Servers {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
	})
	c.WaitReady(n)
	return c
}

func (c *Cluster) start(i int) {
	c.t.Helper()
	s, err := server.NewServer(c.Opts[i])
	if err != nil {
		c.t.Fatalf("natstest: server %d: %v", i, err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		c.t.Fatalf("natstest: server %d not ready", i)
	}
	c.Servers[i] = s
}

// URL returns the client URL of server i.
func (c *Cluster) URL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.Opts[i].Port)
}

// URLs returns every server's client URL, comma-separated, starting with
// server first: NATS clients try them in order when told not to randomize,
// and otherwise at random.
func (c *Cluster) URLs(first int) string {
	urls := []string{c.URL(first)}
	for i := range c.Opts {
		if i != first {
			urls = append(urls, c.URL(i))
		}
	}
	return strings.Join(urls, ",")
}

// Stop shuts server i down, as losing the node would.
func (c *Cluster) Stop(i int) {
	if s := c.Servers[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.Servers[i] = nil
	}
}

// Restart starts a stopped server i again on its ports and store.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.Stop(i)
	c.start(i)
}

// Leader returns the index of the JetStream meta leader, or -1.
func (c *Cluster) Leader() int {
	for i, s := range c.Servers {
		if s != nil && s.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// WaitReady waits until a meta leader knows peers peers and every running
// server is current, as nats-server's waitOnClusterReady does, and healthy
// (its streams' and consumers' replicas caught up).
func (c *Cluster) WaitReady(peers int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l >= 0 && len(c.Servers[l].JetStreamClusterPeers()) >= peers {
			current := true
			for _, s := range c.Servers {
				if s == nil {
					continue
				}
				// Healthz also waits for every stream and consumer replica
				// the server holds to have caught up, as an operator's
				// rolling restart waits for /healthz before the next node:
				// losing a second node while a restarted one still catches
				// up loses the stream's quorum.
				if !s.JetStreamEnabled() || !s.JetStreamIsCurrent() || s.Healthz(nil).Status != "ok" {
					current = false
				}
			}
			if current {
				return
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	c.t.Fatalf("natstest: cluster %s not ready (leader %d)", c.Name, c.Leader())
}
