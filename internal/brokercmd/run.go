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
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/ingress/auth"
	"github.com/switchyard-ai/switchyard/ingress/fleetui"
	"github.com/switchyard-ai/switchyard/ingress/grpcapi"
	"github.com/switchyard-ai/switchyard/ingress/openaihttp"
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cli"
	"github.com/switchyard-ai/switchyard/internal/h1"
	"github.com/switchyard-ai/switchyard/internal/natsauth"
	"github.com/switchyard-ai/switchyard/subjects"
)

// DefaultMaxPayload is the embedded NATS server's max message size: 8 MiB,
// twice the HTTP body limit (openaihttp.DefaultMaxBody, 4 MiB), which
// leaves room for the job envelope and, on migration, the text already
// generated.
const DefaultMaxPayload = 8 << 20

type options struct {
	httpAddr      string
	natsURL       string
	natsListen    string
	dataDir       string
	maxPayload    int
	maxBody       int64
	prefix        string
	id            string
	replicas      int
	jobsStorage   string
	queueMax      int
	hbInterval    time.Duration
	reqTimeout    time.Duration
	stallTimeout  time.Duration
	shutdownGrace time.Duration
	mode          string
	slowStart     time.Duration
	sloTTFT       time.Duration
	sloITL        time.Duration
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
	publishWait   time.Duration
	readHeader    time.Duration
	readBody      time.Duration
	shutdownDelay time.Duration
	idleTimeout   time.Duration
	httpLoop      bool
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
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:8080", "HTTP listen address of the OpenAI API, /metrics and health")
	fs.StringVar(&o.natsURL, "nats-url", "", "external NATS server URLs, comma-separated; empty runs an embedded server")
	fs.StringVar(&o.natsListen, "nats-listen", "127.0.0.1:4222", "embedded NATS: client listen address for agents (port 0 = random)")
	fs.StringVar(&o.dataDir, "data-dir", "", "embedded NATS: JetStream store directory (default $TMPDIR/switchyard-nats-<port>)")
	fs.IntVar(&o.maxPayload, "nats-max-payload", DefaultMaxPayload, "embedded NATS: max message size in bytes")
	fs.Int64Var(&o.maxBody, "max-body", openaihttp.DefaultMaxBody, "largest HTTP request body in bytes (413 above)")
	fs.StringVar(&o.prefix, "prefix", subjects.DefaultPrefix, "first token(s) of every NATS subject")
	fs.StringVar(&o.id, "id", "", "broker id in reply subjects, unique per NATS (default random)")
	fs.IntVar(&o.replicas, "replicas", 1, "replicas of the jobs stream (3 on a cluster)")
	fs.StringVar(&o.jobsStorage, "jobs-storage", "memory", "storage of the jobs stream: memory, or file to keep queued jobs through a NATS server restart")
	fs.IntVar(&o.queueMax, "queue-max", broker.DefaultQueueMax, "jobs waiting per model and pool before 429")
	fs.DurationVar(&o.hbInterval, "heartbeat-interval", broker.DefaultHeartbeatInterval, "agents' heartbeat interval; /readyz waits one")
	fs.DurationVar(&o.reqTimeout, "request-timeout", broker.DefaultRequestTimeout, "deadline of a request")
	fs.DurationVar(&o.stallTimeout, "stall-timeout", broker.DefaultStallTimeout, "end a request whose agent sends nothing for this long")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 30*time.Second, "on SIGTERM, time for in-flight streams to finish")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 0, "on SIGTERM, keep answering 503 on /readyz and new requests this long before closing the listeners (set it above your load balancer's probe interval)")
	fs.StringVar(&o.mode, "dispatch-mode", "capacity", "route choice: capacity (by free slots), paired, count (by agents), slo (per request, the route predicted to meet its latency targets) or threshold (PD for prompts longer than --pd-threshold)")
	fs.DurationVar(&o.sloTTFT, "slo-ttft", 0, "time-to-first-token target of every request that sets none (header x-slo-ttft-ms); 0: none")
	fs.DurationVar(&o.sloITL, "slo-itl", 0, "inter-token latency target of every request that sets none (header x-slo-itl-ms); 0: none")
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
	fs.StringVar(&o.natsConfig, "nats-config", "", "embedded NATS: a nats-server configuration file (accounts, users, permissions, TLS); --nats-listen applies when it sets no port")
	fs.StringVar(&o.natsMonitor, "nats-monitor", "", "embedded NATS: HTTP monitoring listen address, e.g. 127.0.0.1:8222 (empty: off)")
	o.natsAuth = natsauth.RegisterClientFlags(fs)
	fs.Var(&o.apiKeys, "api-key", "API key clients must send as 'Authorization: Bearer KEY' (repeatable; none: no auth)")
	fs.StringVar(&o.apiKeysFile, "api-keys-file", "", "file of API keys, one per line (# comments)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "TLS certificate for HTTP and gRPC (with --tls-key)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "TLS private key for HTTP and gRPC")
	fs.DurationVar(&o.readHeader, "read-header-timeout", 10*time.Second, "HTTP: time a client has to send its request headers")
	fs.DurationVar(&o.readBody, "read-body-timeout", openaihttp.DefaultBodyReadTimeout, "HTTP: time a client has to send its request body (408 after); streams are not bound by it")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 120*time.Second, "HTTP: keep-alive connections idle longer are closed")
	fs.BoolVar(&o.httpLoop, "http-loop", true, "HTTP: serve the completion posts on the broker's own HTTP/1.1 loop (internal/h1) and the rest with net/http; false: net/http for all")
	fs.DurationVar(&o.streamWrite, "stream-write-timeout", 30*time.Second, "HTTP: a streaming client that accepts no data for this long is cut off and its request cancelled")
	fs.DurationVar(&o.writeTimeout, "write-timeout", 0, "HTTP: bound on writing a non-streaming response (0: the request timeout)")
	fs.DurationVar(&o.queueTimeout, "queue-timeout", broker.DefaultQueueTimeout, "end a request (503) that no agent took this long; its job never starts")
	fs.DurationVar(&o.kvHold, "kv-hold", broker.DefaultKVHold, "PD: how long prefill engines hold a hand-off's KV; a decode job not taken within it is retried (match the agents' --kv-hold)")
	fs.DurationVar(&o.publishWait, "publish-wait", broker.DefaultPublishWait, "how long a request waits for NATS to take its job (a leader election or a reconnect to another node on a cluster) before 503 with Retry-After; retries and migrations wait as long")
	fs.DurationVar(&o.capacityWait, "capacity-wait", 0, "a request for a model that no agent serves right now waits this long for one to become ready, then 503 with Retry-After (0: at once; a retry or migration waits --publish-wait)")
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
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cli.SetUsage(fs, `broker: Switchyard's entry point. OpenAI-compatible HTTP and gRPC in front, NATS
JetStream behind, capacity-weighted dispatch between the regular pool and the
prefill/decode pipeline.

Usage:
  broker [flags]                      embedded NATS on --nats-listen
  broker --nats-url nats://a,nats://b use an existing NATS server or cluster
  broker --demo                       also run simulated agents, ready for curl`, []cli.Section{
		{Title: "Client API", Flags: []string{"http", "grpc", "max-body", "read-header-timeout", "read-body-timeout", "idle-timeout", "http-loop", "write-timeout", "stream-write-timeout", "grpc-max-recv-bytes", "grpc-max-send-bytes", "api-key", "api-keys-file", "tls-cert", "tls-key"}},
		{Title: "Dispatch", Flags: []string{"dispatch-mode", "slo-ttft", "slo-itl", "pd-threshold", "slow-start", "heartbeat-interval", "queue-max", "queue-timeout", "request-timeout", "stall-timeout", "retry-limit", "migration-limit", "publish-wait"}},
		{Title: "NATS", Flags: []string{"nats-url", "nats-listen", "nats-config", "nats-monitor", "data-dir", "nats-max-payload", "replicas", "jobs-storage", "prefix", "id",
			"nats-creds", "nats-nkey", "nats-user", "nats-password", "nats-token", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-inbox-prefix"}},
		{Title: "Lifecycle and logs", Flags: []string{"shutdown-grace", "shutdown-delay", "log-format", "log-level"}},
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
	if o.jobsStorage != "memory" && o.jobsStorage != "file" {
		return nil, fmt.Errorf("--jobs-storage %q: want memory or file", o.jobsStorage)
	}
	if o.sloTTFT < 0 || o.sloITL < 0 || o.pdThreshold < 0 {
		return nil, fmt.Errorf("--slo-ttft, --slo-itl and --pd-threshold must not be negative")
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
	cli.TuneGC(getenv)
	keys, err := auth.LoadKeys(o.apiKeys, o.apiKeysFile)
	if err != nil {
		return err
	}
	var tlsConf, grpcTLS *tls.Config
	if o.tlsCert != "" || o.tlsKey != "" {
		if tlsConf, err = auth.TLSConfig(o.tlsCert, o.tlsKey); err != nil {
			return err
		}
		// Each server gets its own copy: net/http adds its protocols to
		// the config it serves with while gRPC clones its own.
		grpcTLS = tlsConf.Clone()
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
	demo := map[string]int{}
	if o.demo {
		if demo, err = demoSpec(o.demoAgents); err != nil {
			return err
		}
	}

	var ns *server.Server
	natsURL := o.natsURL
	natsOpts := natsClientOpts
	if natsURL == "" {
		ns, err = startEmbedded(o, log)
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		natsURL = ns.ClientURL()
		natsOpts = append(natsOpts, nats.InProcessServer(ns))
	}
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

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := broker.NewMetrics()
	if err := metrics.Register(reg); err != nil {
		return err
	}
	b, err := broker.New(nc, broker.Config{
		ID:                o.id,
		Prefix:            o.prefix,
		Replicas:          o.replicas,
		FileStorage:       o.jobsStorage == "file",
		QueueMax:          o.queueMax,
		HeartbeatInterval: o.hbInterval,
		RequestTimeout:    o.reqTimeout,
		StallTimeout:      o.stallTimeout,
		RetryLimit:        o.retryLimit,
		MigrationLimit:    o.migrationLim,
		QueueTimeout:      o.queueTimeout,
		KVHold:            o.kvHold,
		CapacityWait:      o.capacityWait,
		PublishWait:       o.publishWait,
		Dispatch:          dcfg,
		Targets:           broker.Targets{TTFT: o.sloTTFT, ITL: o.sloITL},
		Affinity: broker.AffinityConfig{
			Mode: o.affMode, Wait: o.affWait, BlockSize: o.affBlockSize, MaxBlocks: o.affMaxBlocks,
			Queue: cmp.Or(o.affQueue, -1), // flag 0: none
			Guard: affinity.Guard{MinBlocks: o.affMinBlocks, BalanceAbs: o.affBalAbs, BalanceRel: o.affBalRel},
		},
		LearnListeners: accountInterest(ns, nc),
	}, broker.WithLogger(log), broker.WithMetrics(metrics), broker.WithConnStatus(func() error { return link.Err(nc) }))
	if err != nil {
		return err
	}
	reg.MustRegister(b.Collector())
	brokerCtx, stopBroker := context.WithCancel(context.WithoutCancel(ctx))
	brokerDone := make(chan error, 1)
	go func() { brokerDone <- b.Run(brokerCtx) }()
	// The broker stops after the HTTP server and the demo agents (defers run
	// last-in first-out), then pending publishes (cancels) are flushed.
	defer func() {
		stopBroker()
		<-brokerDone
		if err := nc.FlushTimeout(2 * time.Second); err != nil {
			log.Warn("NATS flush at exit", "err", err)
		}
	}()
	// Run creates the stream, retrying while NATS is unreachable; until it
	// has, /readyz answers 503 and requests 503.

	// Demo agents are the real worker-agent command with the in-process
	// simulator; they drain when ctx ends, as real agents do on SIGTERM.
	var agents sync.WaitGroup
	defer agents.Wait()
	agentsCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	for _, pool := range []string{subjects.PoolRegular, subjects.PoolPrefill, subjects.PoolDecode} {
		for i := 0; i < demo[pool]; i++ {
			args := []string{
				"--nats-url", natsURL, "--engine", "sim", "--role", pool, "--pd-protocol", o.demoPD,
				"--id", fmt.Sprintf("demo-%s-%d", pool, i+1), "--model", o.demoModel,
				"--slots", strconv.Itoa(o.demoSlots), "--heartbeat", o.hbInterval.String(),
				"--prefix", o.prefix, "--sim-ttft", o.demoTTFT.String(), "--sim-itl", o.demoITL.String(),
				"--log-format", o.logFormat, "--log-level", o.logLevel,
			}
			agents.Add(1)
			go func() {
				defer agents.Done()
				if err := agentcmd.Run(agentsCtx, args, func(string) string { return "" }, io.Discard, stderr); err != nil {
					log.Error("demo agent", "args", args, "err", err)
				}
			}()
		}
	}

	writeTimeout := o.writeTimeout
	if writeTimeout == 0 {
		writeTimeout = o.reqTimeout
	}
	ingress := openaihttp.New(b, openaihttp.Config{
		MaxBody:            o.maxBody,
		WriteTimeout:       writeTimeout,
		StreamWriteTimeout: o.streamWrite,
		BodyReadTimeout:    o.readBody,
		Metrics:            promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
		Page:               fleetui.Handler(),
	}, openaihttp.WithLogger(log))
	if !keys.Enabled() && (tlsConf != nil || !loopback(o.httpAddr)) {
		log.Warn("HTTP and gRPC ingress accept requests without an API key; set --api-key or --api-keys-file", "http", o.httpAddr)
	}
	ln, err := cli.Listen("HTTP API", o.httpAddr, "http")
	if err != nil {
		return err
	}
	// The page and health answer without a key; the page asks for one
	// when /v1/fleet answers 401.
	handler := keys.HTTP(ingress, "/healthz", "/readyz", "/", fleetui.AssetPrefix, fleetui.AssetPrefix+"fleet.js", fleetui.AssetPrefix+"fleet.css")
	netSrv := &http.Server{
		Handler:           handler,
		TLSConfig:         tlsConf,
		ReadHeaderTimeout: o.readHeader,
		IdleTimeout:       o.idleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	var srv interface {
		Shutdown(context.Context) error
		Close() error
	} = netSrv
	serve := func() error {
		if tlsConf != nil {
			return netSrv.ServeTLS(ln, "", "")
		}
		return netSrv.Serve(ln)
	}
	if o.httpLoop {
		loop := &h1.Server{
			Handler:           handler,
			Fast:              openaihttp.OnLoop,
			Fallback:          netSrv,
			MaxBody:           o.maxBody,
			MaxHeaderBytes:    netSrv.MaxHeaderBytes,
			ReadHeaderTimeout: o.readHeader,
			BodyReadTimeout:   o.readBody,
			IdleTimeout:       o.idleTimeout,
			TLSConfig:         tlsConf,
			Log:               log,
		}
		srv, serve = loop, func() error { return loop.Serve(ln) }
	}
	httpDone := make(chan error, 1)
	scheme := "http"
	go func() { httpDone <- serve() }()
	if tlsConf != nil {
		scheme = "https"
	}
	grpcLine := ""
	var gs *grpc.Server
	var gapi *grpcapi.Server
	grpcDone := make(chan error, 1)
	if o.grpcAddr != "" {
		gcfg := grpcapi.Config{MaxRecvMsgSize: o.grpcRecv, MaxSendMsgSize: o.grpcSend}
		if err := gcfg.Validate(); err != nil {
			return err
		}
		gopts := append(grpcapi.ServerOptions(gcfg),
			grpc.ChainUnaryInterceptor(keys.UnaryInterceptor()),
			grpc.ChainStreamInterceptor(keys.StreamInterceptor()))
		if tlsConf != nil {
			gopts = append(gopts, grpc.Creds(credentials.NewTLS(grpcTLS)))
		}
		gln, err := cli.Listen("gRPC API", o.grpcAddr, "grpc")
		if err != nil {
			_ = srv.Close()
			return err
		}
		gs = grpc.NewServer(gopts...)
		gapi = grpcapi.New(b, gcfg, grpcapi.WithLogger(log))
		gapi.Register(gs)
		go func() { grpcDone <- gs.Serve(gln) }()
		grpcLine = " grpc=" + gln.Addr().String()
	}
	log.Info("broker ready", "http", ln.Addr().String(), "grpc", o.grpcAddr, "nats", natsURL, "id", b.ID(), "demo_agents", o.demo)
	fmt.Fprintf(stdout, "switchyard broker listening: http=%s://%s nats=%s%s\n", scheme, ln.Addr(), natsURL, grpcLine)

	select {
	case <-ctx.Done():
	case err := <-httpDone:
		return fmt.Errorf("http server: %w", err)
	case err := <-grpcDone:
		_ = srv.Close()
		return fmt.Errorf("grpc server: %w", err)
	}
	log.Info("shutting down", "grace", o.shutdownGrace, "delay", o.shutdownDelay)
	// Refuse new work first (readyz 503, requests 503) and keep listening
	// for --shutdown-delay so load balancers see it, then stop listening
	// and let the streams in flight finish.
	b.StopAccepting()
	if o.shutdownDelay > 0 {
		time.Sleep(o.shutdownDelay)
	}
	graceCtx, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	if gs != nil {
		gapi.Shutdown()
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		go func() {
			select {
			case <-graceCtx.Done():
				gs.Stop()
			case <-stopped:
			}
		}()
	}
	if err := srv.Shutdown(graceCtx); err != nil {
		log.Warn("streams cut at the end of the grace period", "err", err)
		_ = srv.Close()
	}
	if gs != nil {
		<-grpcDone
	}
	return nil
}

func startEmbedded(o *options, log *slog.Logger) (*server.Server, error) {
	host, port, err := cli.HostPort(o.natsListen)
	if err != nil {
		return nil, err
	}
	dir := o.dataDir
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "switchyard-nats-"+strconv.Itoa(max(port, 0)))
		if port < 0 {
			if dir, err = os.MkdirTemp("", "switchyard-nats-"); err != nil {
				return nil, err
			}
		}
	}
	opts := &server.Options{}
	if o.natsConfig != "" {
		if opts, err = natsauth.ServerOptions(o.natsConfig); err != nil {
			return nil, err
		}
	}
	listenFlag := "nats-listen"
	if opts.Host == "" && opts.Port == 0 {
		opts.Host, opts.Port = host, port
	} else {
		listenFlag = "nats-config (its listen/port) or --nats-listen"
	}
	if opts.StoreDir == "" {
		opts.StoreDir = dir
	}
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
