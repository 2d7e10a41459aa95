package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// The fleet scenario measures what a broker pays to listen to a fleet at
// rest: N simulated ready agents, none taking jobs, each sending the
// heartbeat an agent sends (wire's encoding, on its subjects) once per
// interval, spread evenly over it, over a few connections. The NATS
// server runs in this program, so the broker process's CPU is the
// broker's own.
const (
	fleetInterval = time.Second
	fleetConns    = 4
	fleetModels   = 4
	fleetSlots    = 8
)

// fleetSizes are the fleet sizes the scenario measures by default.
var fleetSizes = []int{100, 500, 1000, 2000, 5000}

// fleetRow is one fleet size's figures.
type fleetRow struct {
	agents                int
	cpuCore, usPerHB      float64
	rssMiB, bytesPerS     float64
	hbPerS                float64
	newBroker, silentDrop time.Duration
}

// heartbeatSim sends the heartbeats of n agents over a few connections.
type heartbeatSim struct {
	n        int
	interval time.Duration
	conns    []*nats.Conn
	subj     []string
	hb       []*wire.Heartbeat
	// last is when each agent last sent (unix nanos).
	last []atomic.Int64
	// silent is the index+1 of an agent that sends nothing; 0: none.
	silent      atomic.Int64
	sent, sent8 atomic.Int64 // heartbeats and bytes sent
}

func newHeartbeatSim(url string, n int, interval time.Duration) (*heartbeatSim, error) {
	s := &heartbeatSim{n: n, interval: interval, last: make([]atomic.Int64, n)}
	sb := subjects.Must(subjects.DefaultPrefix)
	ready := timestamppb.New(time.Now().Add(-time.Hour)) // past any slow start
	for i := range n {
		model := fmt.Sprintf("fleet-model-%d", i%fleetModels)
		id := fmt.Sprintf("fleet-agent-%05d", i)
		subj, err := sb.Heartbeat(model, subjects.PoolRegular, id)
		if err != nil {
			return nil, err
		}
		s.subj = append(s.subj, subj)
		running, waiting, kv := uint32(0), uint32(0), 0.0
		s.hb = append(s.hb, &wire.Heartbeat{
			AgentId: id, Model: model, Pool: subjects.PoolRegular, Engine: "sim", Transport: "inproc",
			State: wire.StateReady, Slots: fleetSlots, PullLimit: fleetSlots,
			EngineRunning: &running, EngineWaiting: &waiting, KvCacheUsage: &kv,
			ReadySince: ready, Interval: durationpb.New(interval), Version: "bench",
		})
	}
	for range fleetConns {
		nc, err := nats.Connect(url, nats.Name("fleet-heartbeats"))
		if err != nil {
			s.close()
			return nil, err
		}
		s.conns = append(s.conns, nc)
	}
	return s, nil
}

func (s *heartbeatSim) close() {
	for _, nc := range s.conns {
		nc.Close()
	}
}

// run sends every agent's heartbeat once per interval until ctx ends,
// agent i at offset i/n of the interval, each connection its share.
func (s *heartbeatSim) run(ctx context.Context) {
	var wg sync.WaitGroup
	for c, nc := range s.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			for period := 0; ; period++ {
				base := start.Add(time.Duration(period) * s.interval)
				for i := c; i < s.n; i += len(s.conns) {
					due := base.Add(s.interval * time.Duration(i) / time.Duration(s.n))
					if d := time.Until(due); d > time.Millisecond {
						select {
						case <-ctx.Done():
							return
						case <-time.After(d):
						}
					}
					if s.silent.Load() == int64(i+1) {
						continue
					}
					hb := s.hb[i]
					hb.Seq++
					hb.SentAt = timestamppb.Now()
					data, err := wire.MarshalHeartbeat(hb)
					if err != nil {
						continue
					}
					if nc.Publish(s.subj[i], data) == nil {
						s.last[i].Store(time.Now().UnixNano())
						s.sent.Add(1)
						s.sent8.Add(int64(len(data)))
					}
				}
			}
		}()
	}
	wg.Wait()
}

// fleetScenario measures each fleet size and prints the table.
func (e *env) fleetScenario(d *doc, sizes, realSizes, clusterSizes []int, directed bool, window time.Duration) error {
	dir, err := os.MkdirTemp(e.tmp, "fleet-nats-")
	if err != nil {
		return err
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: dir, MaxPayload: 8 << 20})
	if err != nil {
		return err
	}
	go ns.Start()
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	if !ns.ReadyForConnections(10 * time.Second) {
		return fmt.Errorf("fleet: nats-server not ready")
	}
	var rows []fleetRow
	for _, n := range sizes {
		r, err := e.fleetSize(ns.ClientURL(), n, window)
		if err != nil {
			return fmt.Errorf("%d agents: %w", n, err)
		}
		rows = append(rows, r)
		e.logf("fleet: %d agents: %.1f%% of a core, %.1f µs per heartbeat", n, r.cpuCore*100, r.usPerHB)
	}
	var real []realRow
	for _, n := range realSizes {
		r, err := e.fleetRealAgents(n)
		if err != nil {
			return fmt.Errorf("%d real agents: %w", n, err)
		}
		real = append(real, r)
		e.logf("fleet: %d real agents: %d JetStream consumers, nats-server RSS %.1f MiB", n, r.consumers, r.natsMiB)
	}
	var cluster []clusterRow
	for _, n := range clusterSizes {
		r, err := e.fleetClusterSize(n, directed, window)
		if err != nil {
			return fmt.Errorf("%d agents on a cluster: %w", n, err)
		}
		cluster = append(cluster, r)
		e.logf("fleet cluster: %s", strings.TrimSpace(strings.Split(clusterTable([]clusterRow{r}), "\n")[2]))
		e.sup.stopAll()
	}
	table := ""
	if len(rows) > 0 {
		table = fleetTable(rows)
	}
	if len(real) > 0 {
		table += "\n" + realTable(real)
	}
	if len(cluster) > 0 {
		table += "\n" + clusterTable(cluster)
		if d.out != "" {
			plot := filepath.Join(d.out, "img", "fleet-cluster.svg")
			if err := writeClusterPlot(plot, cluster); err != nil {
				return err
			}
			e.logf("fleet: wrote %s", plot)
		}
	}
	fmt.Println(table)
	var b strings.Builder
	fmt.Fprintf(&b, "## A broker listening to a fleet at rest\n\n")
	fmt.Fprintf(&b, "Simulated ready agents (%d models, one pool) send the agents' JSON heartbeat once every %s over %d connections; none takes a job. "+
		"The broker is its own process on an external nats-server (in the runner), so its CPU (user + system, from /proc over %s) is the broker's alone.\n\n",
		fleetModels, fleetInterval, fleetConns, window)
	b.WriteString(table)
	d.add(b.String())
	return nil
}

// fleetTable renders rows as a Markdown table.
func fleetTable(rows []fleetRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| agents | broker CPU, %% of a core | CPU per heartbeat | broker RSS | heartbeats/s | heartbeat bytes/s | new broker sees the fleet | silent agent stops counting |\n")
	fmt.Fprintf(&b, "|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f µs | %.1f MiB | %s | %s | %s | %.2f intervals |\n",
			fmtInt(float64(r.agents)), r.cpuCore*100, r.usPerHB, r.rssMiB, fmtInt(r.hbPerS), fmtInt(r.bytesPerS),
			r.newBroker.Round(10*time.Millisecond), r.silentDrop.Seconds()/fleetInterval.Seconds())
	}
	return b.String()
}

// fleetSize runs one broker in front of n simulated agents and measures
// it at rest, then how long a silent agent keeps counting and how long a
// second broker takes to see the whole fleet.
func (e *env) fleetSize(url string, n int, window time.Duration) (fleetRow, error) {
	row := fleetRow{agents: n}
	sim, err := newHeartbeatSim(url, n, fleetInterval)
	if err != nil {
		return row, err
	}
	defer sim.close()
	ctx, stop := context.WithCancel(e.ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sim.run(ctx)
	}()
	defer wg.Wait()
	defer stop()

	profile := ""
	if e.profiles != "" {
		profile = filepath.Join(e.tmp, fmt.Sprintf("fleet-%d.pprof", n))
	}
	br, err := e.startFleetBroker(fmt.Sprintf("fleet-broker-%d", n), url, profile)
	if err != nil {
		return row, err
	}
	if err := waitAgents(e.ctx, br.HTTP, n, 60*time.Second); err != nil {
		_ = br.stop(10 * time.Second)
		return row, err
	}
	// Settle: the runner's start-up and the first scrapes are over.
	time.Sleep(2 * fleetInterval)
	c0, h0, b0, t0 := cpuSeconds([]int{br.pid()}), sim.sent.Load(), sim.sent8.Load(), time.Now()
	select {
	case <-e.ctx.Done():
		return row, e.ctx.Err()
	case <-time.After(window):
	}
	c1, h1, b1, el := cpuSeconds([]int{br.pid()}), sim.sent.Load(), sim.sent8.Load(), time.Since(t0).Seconds()
	row.cpuCore = (c1 - c0) / el
	row.hbPerS = float64(h1-h0) / el
	row.bytesPerS = float64(b1-b0) / el
	row.usPerHB = (c1 - c0) / float64(max(h1-h0, 1)) * 1e6
	if kb, err := rssKB(br.pid()); err == nil {
		row.rssMiB = float64(kb) / 1024
	}

	// The broker measured stops here, so that its profile is of the
	// fleet at rest.
	if err := br.stop(10 * time.Second); err != nil {
		return row, err
	}
	if profile != "" {
		if err := copyFile(profile, filepath.Join(e.profiles, filepath.Base(profile))); err != nil {
			return row, err
		}
	}

	// A new broker: from its start until it counts every agent.
	t := time.Now()
	nb, err := e.startFleetBroker(fmt.Sprintf("fleet-newbroker-%d", n), url, "")
	if err != nil {
		return row, err
	}
	defer nb.stop(10 * time.Second)
	if err := waitAgents(e.ctx, nb.HTTP, n, 60*time.Second); err != nil {
		return row, err
	}
	row.newBroker = time.Since(t)

	// A silent agent: from its last heartbeat until the broker counts it
	// stale.
	sim.silent.Store(1)
	time.Sleep(10 * time.Millisecond) // its send in progress, if any, lands
	lastSent := time.Unix(0, sim.last[0].Load())
	for {
		ready, stale, err := agentCounts(e.ctx, nb.HTTP)
		if err != nil {
			return row, err
		}
		if stale >= 1 || ready < n {
			row.silentDrop = time.Since(lastSent)
			break
		}
		if time.Since(lastSent) > 30*fleetInterval {
			return row, fmt.Errorf("silent agent still counted after %s", time.Since(lastSent))
		}
		time.Sleep(20 * time.Millisecond)
	}
	sim.silent.Store(0)
	return row, nil
}

// startFleetBroker starts a broker on the NATS server at url; with profile
// set it runs inside this program under a CPU profile (see profiled).
func (e *env) startFleetBroker(name, url, profile string) (*brokerProc, error) {
	args := []string{"--nats-url", url, "--http", "127.0.0.1:0", "--grpc", "", "--id", name,
		"--heartbeat-interval", fleetInterval.String(), "--shutdown-grace", "3s", "--log-level", "warn"}
	bin := e.path("broker")
	if profile != "" {
		args = append([]string{"__broker", profile}, args...)
		bin = e.self
	}
	p, err := e.sup.startEnv(e.runtimeEnv("broker"), name, bin, args...)
	if err != nil {
		return nil, err
	}
	m, err := p.waitFor(e.ctx, brokerLine, 30*time.Second)
	if err != nil {
		return nil, err
	}
	return &brokerProc{proc: p, HTTP: m[1], NATS: m[2]}, nil
}

// waitAgents waits until the broker at base counts n ready agents.
func waitAgents(ctx context.Context, base string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ready, _, err := agentCounts(ctx, base)
		if err == nil && ready >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker counts %d of %d agents after %s (%v)", ready, n, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// agentCounts reads the broker's switchyard_agents gauge: the ready agents
// it counts (fresh ones) and the stale ones.
func agentCounts(ctx context.Context, base string) (ready, stale int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "switchyard_agents{") {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		switch {
		case strings.Contains(line, `state="ready"`):
			ready += int(v)
		case strings.Contains(line, `state="stale"`):
			stale += int(v)
		}
	}
	return ready, stale, sc.Err()
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}
