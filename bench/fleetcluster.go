package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/loadgen"
)

// The cluster fleet scenario runs what a deployment runs: a 3-node
// JetStream cluster (nats-server processes of the version go.mod pins),
// brokers as processes with the jobs stream at R3, and N agents of the
// agent package in this program, each with its own NATS connection,
// heartbeats, pulls of its pool's queue and of its directed queue, and
// the in-process simulated engine.
const (
	clusterNodes   = 3
	clusterBrokers = 2
	clusterModel   = "fleet-model"
	// clusterRate is the request rate of the loaded window, spread over
	// the brokers.
	clusterRate = 200
)

// clusterRow is one fleet size's figures on the cluster.
type clusterRow struct {
	agents int
	// directed: every agent pulls a directed queue of its own too.
	directed bool
	// up is from the first agent's start until every broker counts all.
	up time.Duration
	// Brokers: mean per broker, fraction of a core; RSS mean per broker.
	brokerRest, brokerLoad float64
	brokerRSS              float64
	// nats-servers: the three together.
	natsRest, natsLoad float64
	natsRSS            float64
	// agentsRSS is this program's RSS with the agents running.
	agentsRSS             float64
	consumers, raftGroups int
	raftNodes             int
	p50, p99              float64 // dispatch decision + publish, ms
	ok, failed            int
	newBroker, silent     time.Duration
	hbBytes, hbPerS       float64
}

// natsNode is one server of the cluster.
type natsNode struct {
	*proc
	url, monitor string
}

// startCluster starts clusterNodes nats-server processes routed to one
// another, each with its store under dir, and waits until every one
// answers healthy with JetStream.
func (e *env) startCluster(dir string, tag string) ([]*natsNode, error) {
	type ports struct{ client, cluster, monitor int }
	ps := make([]ports, clusterNodes)
	var routes []string
	for i := range ps {
		for _, p := range []*int{&ps[i].client, &ps[i].cluster, &ps[i].monitor} {
			n, err := freePort()
			if err != nil {
				return nil, err
			}
			*p = n
		}
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ps[i].cluster))
	}
	var nodes []*natsNode
	stop := func() {
		for _, n := range nodes {
			_ = n.stop(10 * time.Second)
		}
	}
	for i, p := range ps {
		name := fmt.Sprintf("fleet-%s-n%d", tag, i)
		sd := filepath.Join(dir, name)
		pr, err := e.sup.start(name, e.self, natsArg, sd, name, strconv.Itoa(p.client), strconv.Itoa(p.cluster), strconv.Itoa(p.monitor), strings.Join(routes, ","))
		if err != nil {
			stop()
			return nil, err
		}
		m, err := pr.waitFor(e.ctx, natsLine, 30*time.Second)
		if err != nil {
			stop()
			return nil, err
		}
		nodes = append(nodes, &natsNode{proc: pr, url: m[1], monitor: m[2]})
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range nodes {
		for {
			resp, err := http.Get(n.monitor + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				stop()
				return nil, fmt.Errorf("nats-server %s not healthy: %v", n.name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nodes, nil
}

// clusterURLs lists the servers' URLs, server first first.
func clusterURLs(nodes []*natsNode, first int) string {
	var u []string
	for i := range nodes {
		u = append(u, nodes[(first+i)%len(nodes)].url)
	}
	return strings.Join(u, ",")
}

// startClusterBroker starts a broker on the cluster with the jobs stream
// at R3.
func (e *env) startClusterBroker(name, urls string) (*brokerProc, error) {
	args := []string{"--nats-url", urls, "--replicas", "3", "--http", "127.0.0.1:0", "--grpc", "", "--id", name,
		"--heartbeat-interval", fleetInterval.String(), "--shutdown-grace", "3s", "--log-level", "warn"}
	p, err := e.sup.startEnv(e.runtimeEnv("broker"), name, e.path("broker"), args...)
	if err != nil {
		return nil, err
	}
	m, err := p.waitFor(e.ctx, brokerLine, 60*time.Second)
	if err != nil {
		return nil, err
	}
	return &brokerProc{proc: p, HTTP: m[1], NATS: m[2]}, nil
}

// fleetClusterSize measures one fleet size on a cluster of its own.
func (e *env) fleetClusterSize(n int, directed bool, window time.Duration) (clusterRow, error) {
	row := clusterRow{agents: n, directed: directed}
	dir, err := os.MkdirTemp(e.tmp, "fleet-cluster-")
	if err != nil {
		return row, err
	}
	nodes, err := e.startCluster(dir, strconv.Itoa(n))
	if err != nil {
		return row, err
	}
	defer func() {
		for _, nd := range nodes {
			_ = nd.stop(15 * time.Second)
		}
	}()
	var brokers []*brokerProc
	defer func() {
		for _, b := range brokers {
			_ = b.stop(10 * time.Second)
		}
	}()
	for i := range clusterBrokers {
		b, err := e.startClusterBroker(fmt.Sprintf("fleet-c%d-broker-%d", n, i), clusterURLs(nodes, i))
		if err != nil {
			return row, err
		}
		brokers = append(brokers, b)
	}

	// Heartbeat traffic as a subscriber to sy.hb.> sees it.
	mon, err := nats.Connect(clusterURLs(nodes, 0), nats.Name("fleet-monitor"))
	if err != nil {
		return row, err
	}
	defer mon.Close()
	var hbMsgs, hbBytes atomic.Int64
	if _, err := mon.Subscribe("sy.hb.>", func(m *nats.Msg) {
		hbMsgs.Add(1)
		hbBytes.Add(int64(len(m.Data)))
	}); err != nil {
		return row, err
	}

	// The agents.
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	defer func() {
		cancel()
		wg.Wait()
	}()
	t0 := time.Now()
	for i := range n {
		args := []string{"--nats-url", clusterURLs(nodes, i), "--engine", "sim", "--id", fmt.Sprintf("fleet-%05d", i), "--model", clusterModel,
			"--heartbeat", fleetInterval.String(), "--slow-start", "0", "--log-level", "error"}
		if !directed {
			args = append(args, "--no-directed")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := agentcmd.Run(ctx, args, func(string) string { return "" }, io.Discard, io.Discard); err != nil && ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	for _, b := range brokers {
		if err := waitAgents(e.ctx, b.HTTP, n, 5*time.Minute); err != nil {
			select {
			case aerr := <-errs:
				return row, fmt.Errorf("%w (an agent: %v)", err, aerr)
			default:
			}
			return row, err
		}
	}
	row.up = time.Since(t0)
	e.logf("fleet cluster: %d agents counted by %d brokers after %s", n, len(brokers), row.up.Round(100*time.Millisecond))
	time.Sleep(3 * fleetInterval) // pulls in place, start-up work over

	var bp, np []int
	for _, b := range brokers {
		bp = append(bp, b.pid())
	}
	for _, nd := range nodes {
		np = append(np, nd.pid())
	}
	// At rest.
	bc0, nc0, m0, by0, w0 := cpuSeconds(bp), cpuSeconds(np), hbMsgs.Load(), hbBytes.Load(), time.Now()
	if err := sleepCtx(e.ctx, window); err != nil {
		return row, err
	}
	el := time.Since(w0).Seconds()
	row.brokerRest = (cpuSeconds(bp) - bc0) / el / float64(len(bp))
	row.natsRest = (cpuSeconds(np) - nc0) / el
	row.hbPerS = float64(hbMsgs.Load()-m0) / el
	row.hbBytes = float64(hbBytes.Load()-by0) / el
	for _, b := range brokers {
		if kb, err := rssKB(b.pid()); err == nil {
			row.brokerRSS += float64(kb) / 1024 / float64(len(brokers))
		}
	}
	for _, nd := range nodes {
		if kb, err := rssKB(nd.pid()); err == nil {
			row.natsRSS += float64(kb) / 1024
		}
	}
	if kb, err := rssKB(os.Getpid()); err == nil {
		row.agentsRSS = float64(kb) / 1024
	}
	if row.consumers, err = jsConsumers(e.ctx, mon); err != nil {
		return row, err
	}
	row.raftGroups, row.raftNodes = raftGroups(nodes)

	// At clusterRate requests per second, spread over the brokers.
	var hosts []string
	for _, b := range brokers {
		hosts = append(hosts, strings.TrimPrefix(b.HTTP, "http://"))
	}
	h0, err := dispatchHist(brokers)
	if err != nil {
		return row, err
	}
	bc0, nc0, w0 = cpuSeconds(bp), cpuSeconds(np), time.Now()
	rep, _, err := e.load(loadgen.Config{URL: brokers[0].HTTP, Model: clusterModel, Rate: clusterRate, Concurrency: 1000, Seed: 5,
		Duration: window, PromptTokens: loadgen.Fixed(16), MaxTokens: loadgen.Fixed(4), Timeout: 30 * time.Second}, false, hosts...)
	if err != nil {
		return row, err
	}
	el = time.Since(w0).Seconds()
	row.brokerLoad = (cpuSeconds(bp) - bc0) / el / float64(len(bp))
	row.natsLoad = (cpuSeconds(np) - nc0) / el
	row.ok, row.failed = rep.Requests-errCount(rep), errCount(rep)
	if row.failed > 0 {
		e.logf("fleet cluster: %d agents: failed requests: %s", n, errText(rep))
	}
	h1, err := dispatchHist(brokers)
	if err != nil {
		return row, err
	}
	d := h1.sub(h0)
	row.p50, row.p99 = d.quantile(.5)*1e3, d.quantile(.99)*1e3

	// A new broker: from its start until it counts every agent.
	t := time.Now()
	nb, err := e.startClusterBroker(fmt.Sprintf("fleet-c%d-newbroker", n), clusterURLs(nodes, 2))
	if err != nil {
		return row, err
	}
	brokers = append(brokers, nb)
	if err := waitAgents(e.ctx, nb.HTTP, n, 2*time.Minute); err != nil {
		return row, err
	}
	row.newBroker = time.Since(t)

	// A silent agent: one more, simulated, that stops sending.
	sim, err := newHeartbeatSim(clusterURLs(nodes, 1), 1, fleetInterval)
	if err != nil {
		return row, err
	}
	defer sim.close()
	sctx, sstop := context.WithCancel(e.ctx)
	defer sstop()
	go sim.run(sctx)
	if err := waitAgents(e.ctx, nb.HTTP, n+1, time.Minute); err != nil {
		return row, err
	}
	time.Sleep(2 * fleetInterval)
	sim.silent.Store(1)
	time.Sleep(10 * time.Millisecond)
	lastSent := time.Unix(0, sim.last[0].Load())
	for {
		ready, stale, err := agentCounts(e.ctx, nb.HTTP)
		if err != nil {
			return row, err
		}
		if stale >= 1 || ready < n+1 {
			row.silent = time.Since(lastSent)
			break
		}
		if time.Since(lastSent) > 30*fleetInterval {
			return row, fmt.Errorf("silent agent still counted after %s", time.Since(lastSent))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return row, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// jsConsumers is the number of JetStream consumers on every stream.
func jsConsumers(ctx context.Context, nc *nats.Conn) (int, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	total := 0
	streams := js.ListStreams(ctx)
	for s := range streams.Info() {
		total += s.State.Consumers
	}
	return total, streams.Err()
}

// raftGroups reads each server's /raftz for the account the streams
// live in: the distinct groups (a stream's or a consumer's replicas) and
// the raft nodes the servers run for them together.
func raftGroups(nodes []*natsNode) (groups, raftNodes int) {
	seen := map[string]bool{}
	for _, nd := range nodes {
		resp, err := http.Get(nd.monitor + "/raftz?acc=%24G")
		if err != nil {
			continue
		}
		var st map[string]map[string]json.RawMessage
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, gs := range st {
			for g := range gs {
				seen[g] = true
				raftNodes++
			}
		}
	}
	return len(seen), raftNodes
}

// hist is a Prometheus histogram's cumulative buckets.
type hist struct {
	le    []float64
	count []float64
}

func (h hist) sub(o hist) hist {
	out := hist{le: h.le, count: make([]float64, len(h.count))}
	for i := range h.count {
		out.count[i] = h.count[i]
		if i < len(o.count) {
			out.count[i] -= o.count[i]
		}
	}
	return out
}

// quantile interpolates linearly within the bucket holding q.
func (h hist) quantile(q float64) float64 {
	if len(h.count) == 0 || h.count[len(h.count)-1] == 0 {
		return math.NaN()
	}
	rank := q * h.count[len(h.count)-1]
	lo, below := 0.0, 0.0
	for i, c := range h.count {
		if c >= rank {
			if math.IsInf(h.le[i], 1) {
				return lo
			}
			if c == below {
				return h.le[i]
			}
			return lo + (h.le[i]-lo)*(rank-below)/(c-below)
		}
		lo, below = h.le[i], c
	}
	return lo
}

// dispatchHist sums the brokers' switchyard_dispatch_publish_seconds.
func dispatchHist(brokers []*brokerProc) (hist, error) {
	sum := map[float64]float64{}
	for _, b := range brokers {
		resp, err := http.Get(b.HTTP + "/metrics")
		if err != nil {
			return hist{}, err
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			rest, ok := strings.CutPrefix(line, `switchyard_dispatch_publish_seconds_bucket{le="`)
			if !ok {
				continue
			}
			les, val, ok := strings.Cut(rest, `"} `)
			if !ok {
				continue
			}
			le, err1 := strconv.ParseFloat(les, 64)
			v, err2 := strconv.ParseFloat(val, 64)
			if err1 == nil && err2 == nil {
				sum[le] += v
			}
		}
		resp.Body.Close()
	}
	var h hist
	for le := range sum {
		h.le = append(h.le, le)
	}
	if len(h.le) == 0 {
		return h, fmt.Errorf("no switchyard_dispatch_publish_seconds on the brokers' /metrics")
	}
	sort.Float64s(h.le)
	for _, le := range h.le {
		h.count = append(h.count, sum[le])
	}
	return h, nil
}

// clusterTable renders rows as a Markdown table.
func clusterTable(rows []clusterRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| agents | directed queues | fleet counted after | broker CPU at rest | at %d req/s | broker RSS | nats-servers CPU at rest | at %d req/s | nats-servers RSS | JetStream consumers | raft groups | decision + publish p50 / p99 | requests ok / failed | new broker sees the fleet | silent agent stops counting | heartbeats/s | heartbeat bytes/s | agents' process RSS |\n",
		clusterRate, clusterRate)
	fmt.Fprintf(&b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		dq := "none"
		if r.directed {
			dq = "one per agent"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f%% | %.1f%% | %.0f MiB | %.0f%% | %.0f%% | %.0f MiB | %s | %s | %.2f / %.2f ms | %d / %d | %s | %.2f intervals | %s | %s | %.0f MiB |\n",
			fmtInt(float64(r.agents)), dq, r.up.Round(100*time.Millisecond), r.brokerRest*100, r.brokerLoad*100, r.brokerRSS,
			r.natsRest*100, r.natsLoad*100, r.natsRSS, fmtInt(float64(r.consumers)), fmtInt(float64(r.raftGroups)),
			r.p50, r.p99, r.ok, r.failed, r.newBroker.Round(10*time.Millisecond), r.silent.Seconds()/fleetInterval.Seconds(),
			fmtInt(r.hbPerS), fmtInt(r.hbBytes), r.agentsRSS)
	}
	return b.String()
}

// writeClusterPlot draws the cost of the fleet at rest against its size:
// a broker's CPU and the three nats-servers' CPU (% of a core), and the
// servers' RSS (MiB / 10), per mode of directed queues measured.
func writeClusterPlot(path string, rows []clusterRow) error {
	var cs []curve
	for _, directed := range []bool{false, true} {
		tag := ""
		if directed {
			tag = ", directed"
		}
		broker := curve{name: "broker CPU %" + tag}
		servers := curve{name: "servers CPU %" + tag}
		rss := curve{name: "servers MiB/10" + tag}
		for _, r := range rows {
			if r.directed != directed {
				continue
			}
			x := float64(r.agents)
			broker.x, broker.y = append(broker.x, x), append(broker.y, r.brokerRest*100)
			servers.x, servers.y = append(servers.x, x), append(servers.y, r.natsRest*100)
			rss.x, rss.y = append(rss.x, x), append(rss.y, r.natsRSS/10)
		}
		if len(broker.x) > 0 {
			cs = append(cs, broker, servers, rss)
		}
	}
	return lineChart{title: "A fleet at rest on a 3-node cluster: cost against fleet size", xLabel: "agents",
		yLabel: "% of a core; MiB / 10", guide: 10}.write(path, cs)
}
