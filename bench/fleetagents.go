package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
)

// natsArg runs this program as a nats-server alone ("__nats DIR"), so that
// the server's memory is a process's of its own; "__nats DIR NAME PORT
// CLUSTER-PORT MONITOR-PORT ROUTES" runs it as one node of a cluster.
const natsArg = "__nats"

var natsLine = regexp.MustCompile(`nats listening: (\S+) monitor=(\S+)`)

// runNATS serves JetStream with its store in dir until SIGTERM.
func runNATS(dir string, cluster ...string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, HTTPHost: "127.0.0.1", HTTPPort: -1,
		NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir, MaxPayload: 8 << 20}
	if len(cluster) == 5 {
		ports := make([]int, 3)
		for i := range ports {
			p, err := strconv.Atoi(cluster[1+i])
			if err != nil {
				return fmt.Errorf("port %q: %w", cluster[1+i], err)
			}
			ports[i] = p
		}
		opts.ServerName = cluster[0]
		opts.Port, opts.HTTPPort = ports[0], ports[2]
		opts.Cluster = server.ClusterOpts{Name: "fleet", Host: "127.0.0.1", Port: ports[1]}
		opts.Routes = server.RoutesFromStr(cluster[4])
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return fmt.Errorf("nats-server not ready")
	}
	fmt.Printf("nats listening: %s monitor=http://%s\n", ns.ClientURL(), ns.MonitorAddr())
	<-ctx.Done()
	ns.Shutdown()
	ns.WaitForShutdown()
	return nil
}

// realRow is one fleet of real agents.
type realRow struct {
	agents, consumers, streams int
	natsMiB                    float64
}

// fleetRealAgents runs n agents of the agent package with the in-process
// simulator (each its own NATS connection, pulls and directed queue)
// against a broker and a nats-server of their own, and reads the
// server's JetStream consumers and RSS once the broker counts them all.
func (e *env) fleetRealAgents(n int) (realRow, error) {
	row := realRow{agents: n}
	dir, err := os.MkdirTemp(e.tmp, "fleet-real-")
	if err != nil {
		return row, err
	}
	np, err := e.sup.start(fmt.Sprintf("fleet-nats-%d", n), e.self, natsArg, dir)
	if err != nil {
		return row, err
	}
	defer np.stop(10 * time.Second)
	m, err := np.waitFor(e.ctx, natsLine, 30*time.Second)
	if err != nil {
		return row, err
	}
	url, monitor := m[1], m[2]
	br, err := e.startFleetBroker(fmt.Sprintf("fleet-real-broker-%d", n), url, "")
	if err != nil {
		return row, err
	}
	defer br.stop(10 * time.Second)
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		args := []string{"--nats-url", url, "--engine", "sim", "--id", fmt.Sprintf("real-%03d", i), "--model", "fleet-real",
			"--heartbeat", fleetInterval.String(), "--slow-start", "0", "--log-level", "error"}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := agentcmd.Run(ctx, args, func(string) string { return "" }, io.Discard, io.Discard); err != nil && ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	if err := waitAgents(e.ctx, br.HTTP, n, 120*time.Second); err != nil {
		select {
		case aerr := <-errs:
			return row, fmt.Errorf("%w (an agent: %v)", err, aerr)
		default:
		}
		return row, err
	}
	time.Sleep(2 * fleetInterval) // every agent's pulls are in place
	var js struct {
		Streams   int `json:"streams"`
		Consumers int `json:"consumers"`
	}
	resp, err := http.Get(monitor + "/jsz")
	if err != nil {
		return row, err
	}
	err = json.NewDecoder(resp.Body).Decode(&js)
	resp.Body.Close()
	if err != nil {
		return row, err
	}
	row.streams, row.consumers = js.Streams, js.Consumers
	if kb, err := rssKB(np.pid()); err == nil {
		row.natsMiB = float64(kb) / 1024
	}
	return row, nil
}

// realTable renders rows as a Markdown table.
func realTable(rows []realRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| real agents | JetStream streams | JetStream consumers | consumers per agent | nats-server RSS |\n|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %d | %d | %.2f | %.1f MiB |\n", r.agents, r.streams, r.consumers, float64(r.consumers)/float64(r.agents), r.natsMiB)
	}
	return b.String()
}
