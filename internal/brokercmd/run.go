// Package brokercmd is the broker command; cmd/broker is its main.
package brokercmd

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/batch"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/ingress/auth"
	"github.com/switchyard-ai/switchyard/ingress/fleetui"
	"github.com/switchyard-ai/switchyard/ingress/grpcapi"
	"github.com/switchyard-ai/switchyard/ingress/openaihttp"
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cli"
	"github.com/switchyard-ai/switchyard/internal/natsauth"
	"github.com/switchyard-ai/switchyard/subjects"
)

// DefaultMaxPayload is the embedded NATS server's max message size: 8 MiB,
// twice the HTTP body limit (openaihttp.DefaultMaxBody, 4 MiB), which
// leaves room for the job envelope and, on migration, the text already
// generated.
const DefaultMaxPayload = 8 << 20

// DefaultMaxConns bounds the client connections open at once, HTTP and
// gRPC together.
const DefaultMaxConns = 8192

// DefaultMaxConnsPerClient is one client's share of DefaultMaxConns: an
// eighth, so that a few greedy clients leave room for the others and for
// health probes.
const DefaultMaxConnsPerClient = DefaultMaxConns / 8

// DefaultWriteTimeout bounds writing an answer that does not stream.
const DefaultWriteTimeout = 30 * time.Second

type options struct {
	httpAddr      string
	metricsAddr   string
	natsURL       string
	natsListen    string
	natsListenSet bool // given on the command line or in the environment
	dataDir       string
	maxPayload    int
	maxBody       int64
	prefix        string
	id            string
	replicas      int
	jobsStorage   string
	dirStorage    string
	queueMax      int
	hbInterval    time.Duration
	reqTimeout    time.Duration
	maxAnswer     int64
	answerBuffer  int64
	stallTimeout  time.Duration
	shutdownGrace time.Duration
	mode          string
	slowStart     time.Duration
	sloTTFT       time.Duration
	sloITL        time.Duration
	probeShare    float64
	probeAge      time.Duration
	pdThreshold   int
	demo          bool
	demoAgents    string
	demoTTFT      time.Duration
	demoITL       time.Duration
	demoSlots     int
	demoModel     string
	demoPD        string
	logFormat     string
	logLevel      string
	grpcAddr      string
	grpcRecv      int
	grpcSend      int
	grpcHeader    int
	grpcStreams   int
	grpcWatches   int
	natsConfig    string
	natsMonitor   string
	natsAuth      *natsauth.ClientFlags
	apiKeys       auth.KeyFlag
	apiKeysFile   string
	tlsCert       string
	tlsKey        string
	retryLimit    int
	migrationLim  int
	queueTimeout  time.Duration
	kvHold        time.Duration
	capacityWait  time.Duration
	models        string
	publishWait   time.Duration
	readHeader    time.Duration
	readBody      time.Duration
	shutdownDelay time.Duration
	idleTimeout   time.Duration
	maxConns      int
	maxConnsPer   int
	writeTimeout  time.Duration
	streamWrite   time.Duration
	affinity      string
	affWait       time.Duration
	affMinBlocks  int
	affBalAbs     int
	affBalRel     float64
	affBlockSize  int
	affMaxBlocks  int
	affQueue      int
	affMode       broker.AffinityMode
	batch         batchOptions
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:8080", "HTTP listen address of the OpenAI API, /metrics and health")
	fs.StringVar(&o.metricsAddr, "metrics-listen", "", "serve /metrics, /healthz and /readyz also on this address, without API keys, e.g. 0.0.0.0:9091 in a pod for Prometheus and the probes (empty: only on --http, where /metrics needs a key when keys are set); bind it where only the scraper reaches it")
	fs.StringVar(&o.natsURL, "nats-url", "", "external NATS server URLs, comma-separated; empty runs an embedded server")
	fs.StringVar(&o.natsListen, "nats-listen", "127.0.0.1:4222", "embedded NATS: client listen address for agents (port 0 = random)")
	fs.StringVar(&o.dataDir, "data-dir", "", "embedded NATS: JetStream store directory (default $TMPDIR/switchyard-nats-<port>; with --demo, removed on exit)")
	fs.IntVar(&o.maxPayload, "nats-max-payload", DefaultMaxPayload, "embedded NATS: max message size in bytes")
	fs.Int64Var(&o.maxBody, "max-body", openaihttp.DefaultMaxBody, "largest HTTP request body in bytes (413 above)")
	fs.StringVar(&o.prefix, "prefix", subjects.DefaultPrefix, "first token(s) of every NATS subject")
	fs.StringVar(&o.id, "id", "", "broker id in reply subjects, unique per NATS (default random)")
	fs.IntVar(&o.replicas, "replicas", 1, "replicas of the jobs stream (3 on a cluster)")
	fs.StringVar(&o.jobsStorage, "jobs-storage", "file", "storage of the jobs stream: file (queued jobs outlive a NATS server's restart, and it fits servers that keep JetStream on disk only, as the NATS Helm chart's with max_memory_store 0) or memory (faster; a job queued on a server that restarts is dispatched again). An existing stream keeps the storage it was created with")
	fs.StringVar(&o.dirStorage, "directed-storage", "memory", "storage of the directed queues' stream (affinity offers; one replica whatever --replicas says): memory, or file where the servers give JetStream no memory (the broker also falls back to file when memory is refused)")
	fs.IntVar(&o.queueMax, "queue-max", broker.DefaultQueueMax, "jobs waiting per model and pool before 429")
	fs.DurationVar(&o.hbInterval, "heartbeat-interval", broker.DefaultHeartbeatInterval, "agents' heartbeat interval; /readyz waits one")
	fs.DurationVar(&o.reqTimeout, "request-timeout", broker.DefaultRequestTimeout, "deadline of a request")
	fs.Int64Var(&o.maxAnswer, "max-answer-bytes", broker.DefaultMaxAnswerBytes, "largest engine answer relayed to one request, in bytes; past it the request ends with engine_output_too_large (502) and its engine request is cancelled")
	fs.Int64Var(&o.answerBuffer, "answer-buffer-bytes", broker.DefaultBufferBytes, "bytes of a stream held for a client that reads more slowly than its engine writes; past it the request ends with slow_reader")
	fs.DurationVar(&o.stallTimeout, "stall-timeout", broker.DefaultStallTimeout, "end a request whose agent sends nothing for this long")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 30*time.Second, "on SIGTERM, time for in-flight streams to finish")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 0, "on SIGTERM, keep answering 503 on /readyz and new requests this long before closing the listeners (set it above your load balancer's probe interval)")
	fs.StringVar(&o.mode, "dispatch-mode", "slo", "route choice: slo (per request, the route predicted to meet its latency targets; capacity for a request without targets), capacity (by free slots), paired, count (by agents) or threshold (PD for prompts longer than --pd-threshold)")
	fs.DurationVar(&o.sloTTFT, "slo-ttft", 0, "time-to-first-token target of every request that sets none (header x-slo-ttft-ms); 0: none")
	fs.DurationVar(&o.sloITL, "slo-itl", 0, "inter-token latency target of every request that sets none (header x-slo-itl-ms); 0: none")
	fs.Float64Var(&o.probeShare, "slo-probe-share", dispatch.DefaultProbeShare, "--dispatch-mode slo: share of short prompts with targets sent as probes to a route the predictions avoid whose learned figures are stale, so they are learned afresh (0: no probes; at most one per model every 100ms)")
	fs.DurationVar(&o.probeAge, "slo-probe-age", dispatch.DefaultProbeAge, "--dispatch-mode slo: age of a route's newest learned sample past which it is probed")
	fs.IntVar(&o.pdThreshold, "pd-threshold", dispatch.DefaultPDThreshold, "--dispatch-mode threshold: prompts with more tokens than this not cached on the regular pool go to PD")
	fs.DurationVar(&o.slowStart, "slow-start", dispatch.DefaultSlowStart, "ramp of a new agent's slots from the floor to full (0 disables)")
	fs.BoolVar(&o.demo, "demo", false, "also run simulated agents in-process")
	fs.StringVar(&o.demoAgents, "demo-agents", "regular=2", "demo agents per pool, e.g. regular=2,prefill=1,decode=1")
	fs.StringVar(&o.demoModel, "demo-model", "sim-model", "model the demo agents serve")
	fs.StringVar(&o.demoPD, "demo-pd-protocol", "vllm", "PD hand-off of demo prefill and decode agents: vllm or sglang")
	fs.DurationVar(&o.demoTTFT, "demo-ttft", 20*time.Millisecond, "demo engines' base time to first token")
	fs.DurationVar(&o.demoITL, "demo-itl", 10*time.Millisecond, "demo engines' inter-token latency")
	fs.IntVar(&o.demoSlots, "demo-slots", 8, "demo agents' slots")
	fs.StringVar(&o.grpcAddr, "grpc", "127.0.0.1:9090", "gRPC listen address of the switchyard.v1 API, health and reflection (empty: off)")
	fs.IntVar(&o.grpcRecv, "grpc-max-recv-bytes", grpcapi.DefaultMaxRecvMsgSize, "largest gRPC request message in bytes")
	fs.IntVar(&o.grpcSend, "grpc-max-send-bytes", grpcapi.DefaultMaxSendMsgSize, "largest gRPC response message in bytes")
	fs.IntVar(&o.grpcHeader, "grpc-max-header-bytes", grpcapi.DefaultMaxHeaderListSize, "gRPC: largest header list (metadata) of a stream in bytes, uncompressed; a stream past it is reset")
	fs.IntVar(&o.grpcStreams, "grpc-max-streams", grpcapi.DefaultMaxConcurrentStreams, "gRPC: streams open at once on one connection")
	fs.IntVar(&o.grpcWatches, "grpc-max-watches", grpcapi.DefaultMaxWatches, "gRPC: health Watch streams open at once over all connections (RESOURCE_EXHAUSTED past it)")
	fs.StringVar(&o.natsConfig, "nats-config", "", "embedded NATS: a nats-server configuration file (accounts, users, permissions, TLS); --nats-listen, when given, wins over its listen, and --data-dir always over its store_dir")
	fs.StringVar(&o.natsMonitor, "nats-monitor", "", "embedded NATS: HTTP monitoring listen address, e.g. 127.0.0.1:8222 (empty: off)")
	o.natsAuth = natsauth.RegisterClientFlags(fs)
	fs.Var(&o.apiKeys, "api-key", "API key clients must send as 'Authorization: Bearer KEY' (repeatable; none: no auth)")
	fs.StringVar(&o.apiKeysFile, "api-keys-file", "", "file of API keys, one per line (# comments)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "TLS certificate for HTTP and gRPC (with --tls-key)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "TLS private key for HTTP and gRPC")
	fs.DurationVar(&o.readHeader, "read-header-timeout", 10*time.Second, "HTTP: time a client has to send its request headers; gRPC: to finish its TLS and HTTP/2 handshake")
	fs.DurationVar(&o.readBody, "read-body-timeout", openaihttp.DefaultBodyReadTimeout, "HTTP: time a client has to send its request body (408 after); streams are not bound by it")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 120*time.Second, "HTTP: keep-alive connections idle longer are closed; gRPC: connections with no stream open longer")
	fs.IntVar(&o.maxConns, "max-conns", DefaultMaxConns, "HTTP and gRPC together: connections open at once; past it a new connection is refused before TLS (plain HTTP gets 503) (0: no bound)")
	fs.IntVar(&o.maxConnsPer, "max-conns-per-client", DefaultMaxConnsPerClient, "HTTP and gRPC together: connections one client (IPv4 address, IPv6 /64) may hold open; behind a proxy, the proxy is the client (0: no bound)")
	fs.DurationVar(&o.streamWrite, "stream-write-timeout", 30*time.Second, "HTTP: a streaming client that accepts no data for this long is cut off and its request cancelled")
	fs.DurationVar(&o.writeTimeout, "write-timeout", DefaultWriteTimeout, "HTTP: bound on writing an answer that does not stream, from its start; streams are bound by --stream-write-timeout instead")
	fs.DurationVar(&o.queueTimeout, "queue-timeout", broker.DefaultQueueTimeout, "end a request (503) that no agent took this long; its job never starts")
	fs.DurationVar(&o.kvHold, "kv-hold", broker.DefaultKVHold, "PD: how long prefill engines hold a hand-off's KV; a decode job not taken within it is retried (match the agents' --kv-hold)")
	fs.DurationVar(&o.publishWait, "publish-wait", broker.DefaultPublishWait, "how long a request waits for NATS to take its job (a leader election or a reconnect to another node on a cluster) before 503 with Retry-After; retries and migrations wait as long")
	fs.DurationVar(&o.capacityWait, "capacity-wait", 0, "a request for a model that no agent serves right now waits this long for one to become ready, then 503 with Retry-After (0: at once; a retry or migration waits --publish-wait)")
	fs.StringVar(&o.models, "models", "", "models the fleet serves even while no agent does (a pool scaled to zero), comma-separated: a request for one waits --capacity-wait for an agent instead of 404, and its pools' metrics read 0 (models heard from agents are known for five minutes after the last)")
	fs.IntVar(&o.migrationLim, "migration-limit", broker.DefaultMigrationLimit, "migrations of a stream to another agent after its first token (-1: none; the client then gets one error event)")
	fs.IntVar(&o.retryLimit, "retry-limit", broker.DefaultRetryLimit, "retries of a request before its first token (another agent or route)")
	fs.StringVar(&o.affinity, "affinity", broker.DefaultAffinity.String(), "prefix-cache affinity within a pool: off (pure pull), approx (remember which agent took which prompt, shared with the other brokers), or precise (also the KV events agents forward; approximate for agents without)")
	fs.DurationVar(&o.affWait, "affinity-wait", broker.DefaultAffinityWait, "a job offered to the agent caching its prefix moves to the pool's shared queue if that agent has not taken it within this")
	g := broker.DefaultAffinityGuard()
	fs.IntVar(&o.affMinBlocks, "affinity-min-blocks", g.MinBlocks, "shortest cached prefix (in blocks) worth preferring an agent for")
	fs.IntVar(&o.affBalAbs, "affinity-balance-abs", g.BalanceAbs, "prefer an agent only while its load exceeds the pool's least loaded agent by at most this many requests ...")
	fs.Float64Var(&o.affBalRel, "affinity-balance-rel", g.BalanceRel, "... or by at most this factor")
	fs.IntVar(&o.affBlockSize, "affinity-block-size", affinity.DefaultBlockSize, "words per prefix block; match the engines' block size for KV events in broker keys (sim-engine's), and agents' --affinity-block-size where they translate vLLM's (--kv-events-hash vllm)")
	fs.IntVar(&o.affQueue, "affinity-queue", broker.DefaultAffinityQueue, "offers an agent may have waiting beyond its free slots: a job waits up to --affinity-wait for the agent caching its prefix rather than prefill it elsewhere (0: prefer only agents with a free slot)")
	fs.IntVar(&o.affMaxBlocks, "affinity-max-blocks", affinity.DefaultMaxBlocks, "bound of (block, agent) entries remembered per model and pool")
	registerBatchFlags(fs, &o.batch)
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cli.SetUsage(fs, `broker: Switchyard's entry point. OpenAI-compatible HTTP and gRPC in front, NATS
JetStream behind, capacity-weighted dispatch between the regular pool and the
prefill/decode pipeline.

Usage:
  broker [flags]                      embedded NATS on --nats-listen
  broker --nats-url nats://a,nats://b use an existing NATS server or cluster
  broker --demo                       also run simulated agents, ready for curl`, []cli.Section{
		{Title: "Client API", Flags: []string{"http", "grpc", "max-body", "read-header-timeout", "read-body-timeout", "idle-timeout", "max-conns", "max-conns-per-client", "write-timeout", "stream-write-timeout", "grpc-max-recv-bytes", "grpc-max-send-bytes", "grpc-max-header-bytes", "grpc-max-streams", "grpc-max-watches", "api-key", "api-keys-file", "tls-cert", "tls-key"}},
		{Title: "Dispatch", Flags: []string{"dispatch-mode", "slo-ttft", "slo-itl", "slo-probe-share", "slo-probe-age", "pd-threshold", "slow-start", "heartbeat-interval", "queue-max", "queue-timeout", "capacity-wait", "models", "request-timeout", "stall-timeout", "max-answer-bytes", "answer-buffer-bytes", "retry-limit", "migration-limit", "publish-wait"}},
		{Title: "NATS", Flags: []string{"nats-url", "nats-listen", "nats-config", "nats-monitor", "data-dir", "nats-max-payload", "replicas", "jobs-storage", "directed-storage", "prefix", "id",
			"nats-creds", "nats-nkey", "nats-user", "nats-password", "nats-token", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-inbox-prefix"}},
		{Title: "Files and batches", Flags: batchFlags},
		{Title: "Lifecycle, metrics and logs", Flags: []string{"shutdown-grace", "shutdown-delay", "metrics-listen", "log-format", "log-level"}},
		{Title: "Demo", Flags: []string{"demo", "demo-agents", "demo-model", "demo-pd-protocol", "demo-slots", "demo-ttft", "demo-itl"}},
	})
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := cli.ApplyEnv(fs, getenv); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { o.natsListenSet = o.natsListenSet || f.Name == "nats-listen" })
	if o.jobsStorage != "memory" && o.jobsStorage != "file" {
		return nil, fmt.Errorf("--jobs-storage %q: want memory or file", o.jobsStorage)
	}
	if o.dirStorage != "memory" && o.dirStorage != "file" {
		return nil, fmt.Errorf("--directed-storage %q: want memory or file", o.dirStorage)
	}
	if o.maxConns < 0 || o.maxConnsPer < 0 || o.writeTimeout <= 0 {
		return nil, fmt.Errorf("--max-conns and --max-conns-per-client must not be negative, --write-timeout must be positive")
	}
	if o.sloTTFT < 0 || o.sloITL < 0 || o.pdThreshold < 0 {
		return nil, fmt.Errorf("--slo-ttft, --slo-itl and --pd-threshold must not be negative")
	}
	if !(o.probeShare >= 0 && o.probeShare <= 1) || o.probeAge < 0 {
		return nil, fmt.Errorf("--slo-probe-share must be in [0, 1] and --slo-probe-age must not be negative")
	}
	if err := o.batch.validate(); err != nil {
		return nil, err
	}
	m, err := broker.ParseAffinityMode(o.affinity)
	if err != nil {
		return nil, fmt.Errorf("--affinity: %w", err)
	}
	o.affMode = m
	return o, nil
}

// demoSpec parses "regular=2,prefill=1".
func demoSpec(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		pool, n, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("demo agents %q: want pool=count", part)
		}
		if _, err := dispatch.ParsePool(pool); err != nil {
			return nil, fmt.Errorf("demo agents %q: %w", part, err)
		}
		c, err := strconv.Atoi(n)
		if err != nil || c < 0 || c > 64 {
			return nil, fmt.Errorf("demo agents %q: count 0 to 64", part)
		}
		out[pool] += c
	}
	return out, nil
}

// Run is the broker command: flags from args, environment through getenv.
// It returns when ctx ends and everything it started has stopped.
//
// Its steps: the embedded NATS server (unless --nats-url), the broker,
// the demo agents, and the HTTP and gRPC ingresses, the last two joined
// by an errgroup. On the way out they stop in reverse: the ingresses
// (streams in flight finish within --shutdown-grace) and the demo agents,
// then the broker, whose pending publishes are flushed, then NATS.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log, err := cli.Logger(stderr, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	sec, err := loadSecurity(o)
	if err != nil {
		return err
	}
	natsClientOpts, err := o.natsAuth.Options()
	if err != nil {
		return err
	}
	mode, err := dispatch.ParseMode(o.mode)
	if err != nil {
		return err
	}
	dcfg := dispatch.DefaultConfig()
	dcfg.Mode = mode
	dcfg.SlowStart = o.slowStart
	dcfg.PDThreshold = o.pdThreshold
	dcfg.ProbeShare = o.probeShare
	dcfg.ProbeAge = o.probeAge
	demo := map[string]int{}
	if o.demo {
		if demo, err = demoSpec(o.demoAgents); err != nil {
			return err
		}
	}
	gcfg := grpcapi.Config{
		MaxRecvMsgSize: o.grpcRecv, MaxSendMsgSize: o.grpcSend,
		MaxHeaderListSize: o.grpcHeader, MaxConcurrentStreams: o.grpcStreams, MaxWatches: o.grpcWatches,
		IdleTimeout: o.idleTimeout, HandshakeTimeout: o.readHeader,
	}
	if o.grpcAddr != "" {
		if err := gcfg.Validate(); err != nil {
			return err
		}
	}

	// Embedded server.
	var ns *server.Server
	natsURL := o.natsURL
	natsOpts := natsClientOpts
	if natsURL == "" {
		ns, err = startEmbedded(o, log)
		if err != nil {
			return err
		}
		scratch := o.demo && o.dataDir == "" && o.natsConfig == ""
		store := filepath.Dir(ns.StoreDir()) // the server adds "jetstream"
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
			if scratch {
				// The demo's store under $TMPDIR is scratch: leave none behind.
				_ = os.RemoveAll(store)
			}
		}()
		natsURL = ns.ClientURL()
		natsOpts = append(natsOpts, nats.InProcessServer(ns))
	}

	// Broker.
	// The broker's connection is its own: it needs none of what it
	// publishes back (its learn messages, which every peer reads), which
	// would cost a delivery through its reply path per request.
	link := cli.NewNATSLink(log, "switchyard-broker")
	nc, err := nats.Connect(natsURL, append(append(link.Options(), natsOpts...), nats.NoEcho())...)
	if err != nil {
		return fmt.Errorf("connect NATS %s: %w", natsURL, err)
	}
	go link.Watch(ctx, nc, natsURL, natsOpts)
	defer nc.Close()
	b, reg, err := newBroker(o, log, dcfg, ns, nc, broker.WithConnStatus(func() error { return link.Err(nc) }))
	if err != nil {
		return err
	}
	brokerCtx, stopBroker := context.WithCancel(context.WithoutCancel(ctx))
	brokerDone := make(chan error, 1)
	go func() { brokerDone <- b.Run(brokerCtx) }()
	// The broker stops after the ingresses and the demo agents, then
	// pending publishes (cancels) are flushed.
	defer func() {
		stopBroker()
		<-brokerDone
		if err := nc.FlushTimeout(2 * time.Second); err != nil {
			log.Warn("NATS flush at exit", "err", err)
		}
	}()
	// Run creates the stream, retrying while NATS is unreachable; until it
	// has, /readyz answers 503 and requests 503.

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(runCtx)
	// Demo agents.
	runDemoAgents(gctx, g, o, demo, natsURL, log, stderr)
	// Ingresses.
	bst, err := newBatchStore(o, nc, log)
	if err != nil {
		stop()
		_ = g.Wait()
		return err
	}
	in, err := listenIngresses(o, sec, b, bst, reg, gcfg, log)
	if err != nil {
		// The demo agents started: stop them before returning.
		stop()
		_ = g.Wait()
		return err
	}
	g.Go(in.serveHTTP)
	if in.metrics != nil {
		g.Go(in.serveMetrics)
	}
	if in.grpc != nil {
		g.Go(in.serveGRPC)
	}
	g.Go(func() error {
		<-gctx.Done()
		in.shutdown(o, b, log)
		return nil
	})
	g.Go(func() error {
		watchReady(gctx, b, log)
		return nil
	})
	g.Go(func() error { return runBatchDriver(gctx, o, b.ID(), bst, in.api, b.Models, reg, log) })
	log.Info("broker listening", "http", in.ln.Addr().String(), "grpc", o.grpcAddr, "metrics", in.metricsAddr(), "nats", natsURL, "id", b.ID(), "demo_agents", o.demo)
	fmt.Fprintf(stdout, "switchyard broker listening: http=%s://%s nats=%s%s%s\n", in.scheme(), in.ln.Addr(), natsURL, in.grpcLine(), in.metricsLine())
	return g.Wait()
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// watchReady logs the broker's readiness as /readyz reports it: "broker
// ready" once it takes requests, and each change after, with why it does
// not (a problem of the jobs stream is logged by the broker with its
// cause when it appears). A broker shutting down is not reported.
func watchReady(ctx context.Context, b *broker.Broker, log *slog.Logger) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	was := false // ready at the last look
	for {
		err := b.Ready()
		switch {
		case errors.Is(err, broker.ErrClosed):
			return
		case err == nil && !was:
			log.Info("broker ready", "id", b.ID())
		case err != nil && was:
			log.Warn("broker not ready", "id", b.ID(), "reason", err)
		}
		was = err == nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// security is the client-facing security: API keys and TLS.
type security struct {
	keys    *auth.Keys
	tls     *tls.Config // HTTP's; nil without TLS
	grpcTLS *tls.Config
}

func loadSecurity(o *options) (security, error) {
	keys, err := auth.LoadKeys(o.apiKeys, o.apiKeysFile)
	if err != nil {
		return security{}, err
	}
	sec := security{keys: keys}
	if o.tlsCert != "" || o.tlsKey != "" {
		if sec.tls, err = auth.TLSConfig(o.tlsCert, o.tlsKey); err != nil {
			return security{}, err
		}
		// Each server gets its own copy: net/http adds its protocols to
		// the config it serves with while gRPC clones its own.
		sec.grpcTLS = sec.tls.Clone()
	}
	return sec, nil
}

// newBroker builds the broker on nc and the metrics registry that serves
// its collectors.
func newBroker(o *options, log *slog.Logger, dcfg dispatch.Config, ns *server.Server, nc *nats.Conn, opts ...broker.Option) (*broker.Broker, *prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := broker.NewMetrics()
	if err := metrics.Register(reg); err != nil {
		return nil, nil, err
	}
	b, err := broker.New(nc, broker.Config{
		ID:                  o.id,
		Prefix:              o.prefix,
		Replicas:            o.replicas,
		FileStorage:         o.jobsStorage == "file",
		DirectedFileStorage: o.dirStorage == "file",
		QueueMax:            o.queueMax,
		HeartbeatInterval:   o.hbInterval,
		RequestTimeout:      o.reqTimeout,
		StallTimeout:        o.stallTimeout,
		MaxAnswerBytes:      o.maxAnswer,
		BufferBytes:         o.answerBuffer,
		RetryLimit:          o.retryLimit,
		MigrationLimit:      o.migrationLim,
		QueueTimeout:        o.queueTimeout,
		KVHold:              o.kvHold,
		CapacityWait:        o.capacityWait,
		Models:              splitList(o.models),
		PublishWait:         o.publishWait,
		Dispatch:            dcfg,
		Targets:             broker.Targets{TTFT: o.sloTTFT, ITL: o.sloITL},
		Affinity: broker.AffinityConfig{
			Mode: o.affMode, Wait: o.affWait, BlockSize: o.affBlockSize, MaxBlocks: o.affMaxBlocks,
			Queue: cmp.Or(o.affQueue, -1), // flag 0: none
			Guard: affinity.Guard{MinBlocks: o.affMinBlocks, BalanceAbs: o.affBalAbs, BalanceRel: o.affBalRel},
		},
		LearnListeners: accountInterest(ns, nc),
	}, append([]broker.Option{broker.WithLogger(log), broker.WithMetrics(metrics)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	reg.MustRegister(b.Collector())
	return b, reg, nil
}

// runDemoAgents starts the demo agents in g: the real worker-agent
// command with the in-process simulator. They drain when ctx ends, as
// real agents do on SIGTERM; one that fails is logged, and the broker
// goes on without it.
func runDemoAgents(ctx context.Context, g *errgroup.Group, o *options, demo map[string]int, natsURL string, log *slog.Logger, stderr io.Writer) {
	for _, pool := range []string{subjects.PoolRegular, subjects.PoolPrefill, subjects.PoolDecode} {
		for i := 0; i < demo[pool]; i++ {
			args := []string{
				"--nats-url", natsURL, "--engine", "sim", "--role", pool, "--pd-protocol", o.demoPD,
				"--id", fmt.Sprintf("demo-%s-%d", pool, i+1), "--model", o.demoModel,
				"--slots", strconv.Itoa(o.demoSlots), "--heartbeat", o.hbInterval.String(),
				"--prefix", o.prefix, "--sim-ttft", o.demoTTFT.String(), "--sim-itl", o.demoITL.String(),
				"--log-format", o.logFormat, "--log-level", o.logLevel,
			}
			g.Go(func() error {
				if err := agentcmd.Run(ctx, args, func(string) string { return "" }, io.Discard, stderr); err != nil {
					log.Error("demo agent", "args", args, "err", err)
				}
				return nil
			})
		}
	}
}

// ingresses are the broker's HTTP and gRPC servers and their listeners.
type ingresses struct {
	ln   net.Listener
	api  *openaihttp.Server
	http *http.Server
	tls  bool
	gln  net.Listener
	grpc *grpc.Server // nil: no gRPC ingress
	gapi *grpcapi.Server
	// The metrics listener (--metrics-listen); nil: none.
	mln     net.Listener
	metrics *http.Server
}

// listenIngresses opens the HTTP and gRPC listeners and builds their
// servers; nothing is served until serveHTTP and serveGRPC run.
func listenIngresses(o *options, sec security, b *broker.Broker, bst *batch.Store, reg *prometheus.Registry, gcfg grpcapi.Config, log *slog.Logger) (*ingresses, error) {
	api := openaihttp.New(b, openaihttp.Config{
		MaxBody:            o.maxBody,
		WriteTimeout:       o.writeTimeout,
		StreamWriteTimeout: o.streamWrite,
		BodyReadTimeout:    o.readBody,
		Metrics:            promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
		Page:               fleetui.Handler(),
		Batch:              bst,
	}, openaihttp.WithLogger(log))
	if !sec.keys.Enabled() && (sec.tls != nil || !loopback(o.httpAddr)) {
		log.Warn("HTTP and gRPC ingress accept requests without an API key; set --api-key or --api-keys-file", "http", o.httpAddr)
	}
	ln, err := cli.Listen("HTTP API", o.httpAddr, "http")
	if err != nil {
		return nil, err
	}
	// One limiter counts the connections of both listeners, refused
	// before TLS or a request head is read.
	conns := auth.NewConnLimiter(o.maxConns, o.maxConnsPer)
	refuse := refuseHTTP
	if sec.tls != nil {
		refuse = refuseClose
	}
	ln = conns.Listener(ln, refuse)
	// The page and health answer without a key; the page asks for one
	// when /v1/fleet answers 401. The edge goes before the key check.
	handler := api.Edge(sec.keys.HTTP(api, "/healthz", "/readyz", "/", fleetui.AssetPrefix, fleetui.AssetPrefix+"fleet.js", fleetui.AssetPrefix+"fleet.css"))
	in := &ingresses{ln: ln, api: api, tls: sec.tls != nil, http: &http.Server{
		Handler:           handler,
		TLSConfig:         sec.tls,
		ReadHeaderTimeout: o.readHeader,
		// No WriteTimeout: on HTTP/2 it ends a stream that long after it
		// began, while the engine may still work on its answer. The API's
		// edge sets each answer's write deadline instead.
		IdleTimeout:    o.idleTimeout,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}
	if o.metricsAddr != "" {
		if in.mln, err = cli.Listen("metrics", o.metricsAddr, "metrics-listen"); err != nil {
			_ = ln.Close()
			return nil, err
		}
		in.metrics = metricsServer(api, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), log)
	}
	if o.grpcAddr == "" {
		return in, nil
	}
	gopts := append(grpcapi.ServerOptions(gcfg),
		grpc.ChainUnaryInterceptor(sec.keys.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(sec.keys.StreamInterceptor()))
	// Keys and the share of keyless streams are checked as a stream's
	// headers arrive, before it costs a goroutine or its message is read.
	if tap := sec.keys.TapHandle(auth.DefaultExemptStreamsPerClient); tap != nil {
		gopts = append(gopts, grpc.InTapHandle(tap))
	}
	if sec.grpcTLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(sec.grpcTLS)))
	}
	if in.gln, err = cli.Listen("gRPC API", o.grpcAddr, "grpc"); err != nil {
		_ = ln.Close()
		if in.mln != nil {
			_ = in.mln.Close()
		}
		return nil, err
	}
	in.gln = conns.Listener(in.gln, refuseClose)
	in.grpc = grpc.NewServer(gopts...)
	in.gapi = grpcapi.New(b, gcfg, grpcapi.WithLogger(log))
	in.gapi.Register(in.grpc)
	return in, nil
}

// serveHTTP serves HTTP until shutdown; an error before is the server's.
func (in *ingresses) serveHTTP() error {
	var err error
	if in.tls {
		err = in.http.ServeTLS(in.ln, "", "")
	} else {
		err = in.http.Serve(in.ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("http server: %w", err)
}

// metricsServer serves /metrics, and /healthz and /readyz as the API's
// listener answers them, without API keys: for a Prometheus scrape and the
// probes, on an address only they reach. Nothing else is served there.
func metricsServer(api http.Handler, metrics http.Handler, log *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.Handle("GET /healthz", api)
	mux.Handle("GET /readyz", api)
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serveMetrics serves the metrics listener until shutdown.
func (in *ingresses) serveMetrics() error {
	if err := in.metrics.Serve(in.mln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

func (in *ingresses) metricsAddr() string {
	if in.mln == nil {
		return ""
	}
	return in.mln.Addr().String()
}

func (in *ingresses) metricsLine() string {
	if in.mln == nil {
		return ""
	}
	return " metrics=http://" + in.mln.Addr().String()
}

// serveGRPC serves gRPC until shutdown; an error before is the server's.
func (in *ingresses) serveGRPC() error {
	if err := in.grpc.Serve(in.gln); err != nil {
		return fmt.Errorf("grpc server: %w", err)
	}
	return nil
}

func (in *ingresses) scheme() string {
	if in.tls {
		return "https"
	}
	return "http"
}

func (in *ingresses) grpcLine() string {
	if in.gln == nil {
		return ""
	}
	return " grpc=" + in.gln.Addr().String()
}

// shutdown refuses new work first (readyz 503, requests 503) and keeps
// listening for --shutdown-delay so load balancers see it, then stops
// listening and lets the streams in flight finish within
// --shutdown-grace.
func (in *ingresses) shutdown(o *options, b *broker.Broker, log *slog.Logger) {
	log.Info("shutting down", "grace", o.shutdownGrace, "delay", o.shutdownDelay)
	b.StopAccepting()
	if o.shutdownDelay > 0 {
		time.Sleep(o.shutdownDelay)
	}
	graceCtx, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	httpDone := make(chan error, 1)
	go func() { httpDone <- in.http.Shutdown(graceCtx) }()
	grpcDone := make(chan struct{})
	if in.grpc != nil {
		in.gapi.Shutdown()
		go func() { in.grpc.GracefulStop(); close(grpcDone) }()
	} else {
		close(grpcDone)
	}
	httpErr := <-httpDone
	select {
	case <-grpcDone:
	case <-graceCtx.Done():
	}
	if in.metrics != nil {
		// The last to close: the probes and a scrape see the shutdown.
		defer in.metrics.Close()
	}
	if graceCtx.Err() == nil {
		return
	}
	// The grace is over with streams still open: end each with one error
	// its client can read (an SSE error event and [DONE], a gRPC
	// UNAVAILABLE), not a cut connection, then close what is left.
	n := b.EndCalls(broker.ErrShutdown)
	log.Warn("shutdown grace over: ending the open requests with an error", "requests", n, "grace", o.shutdownGrace)
	endCtx, endCancel := context.WithTimeout(context.Background(), shutdownEndWait)
	defer endCancel()
	if httpErr != nil {
		if err := in.http.Shutdown(endCtx); err != nil {
			_ = in.http.Close()
		}
	}
	select {
	case <-grpcDone:
	case <-endCtx.Done():
		in.grpc.Stop()
		<-grpcDone
	}
}

// shutdownEndWait is how long the handlers of requests ended at the end
// of the shutdown grace get to write their error before their connections
// are closed.
const shutdownEndWait = 2 * time.Second

func startEmbedded(o *options, log *slog.Logger) (*server.Server, error) {
	host, port, err := cli.HostPort(o.natsListen)
	if err != nil {
		return nil, err
	}
	opts := &server.Options{}
	if o.natsConfig != "" {
		if opts, err = natsauth.ServerOptions(o.natsConfig); err != nil {
			return nil, err
		}
	}
	listenFlag := "nats-listen"
	if o.natsListenSet || (opts.Host == "" && opts.Port == 0) {
		opts.Host, opts.Port = host, port
	} else {
		listenFlag = "nats-config (its listen/port) or --nats-listen"
	}
	dir := o.dataDir
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "switchyard-nats-"+strconv.Itoa(max(opts.Port, 0)))
		if opts.Port < 0 {
			if dir, err = os.MkdirTemp("", "switchyard-nats-"); err != nil {
				return nil, err
			}
		}
	}
	// The store is this process's own: one configuration file serves every
	// broker of a fleet, and a store_dir in it is for a standalone server.
	if opts.StoreDir != "" && opts.StoreDir != dir {
		log.Info("embedded NATS: store from --data-dir, not the configuration's store_dir", "store", dir, "store_dir", opts.StoreDir)
	}
	opts.StoreDir = dir
	if opts.MaxPayload == 0 {
		opts.MaxPayload = int32(o.maxPayload)
	}
	if opts.ServerName == "" {
		opts.ServerName = "switchyard-embedded"
	}
	opts.JetStream, opts.NoSigs, opts.NoLog = true, true, true
	if o.natsMonitor != "" {
		mh, mp, err := cli.HostPort(o.natsMonitor)
		if err != nil {
			return nil, fmt.Errorf("--nats-monitor: %w", err)
		}
		opts.HTTPHost, opts.HTTPPort = mh, mp
	}
	if w := natsauth.CheckExposure(opts); w != "" {
		log.Warn(w)
	}
	// nats-server listens in the background and, told to keep quiet, only
	// fails to become ready: find a taken port now and say which.
	if err := checkEmbeddedPorts(opts, listenFlag); err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS did not start on %s within 10s (is the port taken? --%s moves it; --nats-url uses an external server instead)", net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), listenFlag)
	}
	log.Info("embedded NATS running", "url", ns.ClientURL(), "store", opts.StoreDir, "max_payload", opts.MaxPayload, "config", o.natsConfig)
	return ns, nil
}

// loopback reports whether addr binds only the loopback interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
