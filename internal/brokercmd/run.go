// Package brokercmd is the broker command; cmd/broker is its main.
package brokercmd

import (
	"context"
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

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/ingress/openaihttp"
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cli"
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
	queueMax      int
	hbInterval    time.Duration
	reqTimeout    time.Duration
	stallTimeout  time.Duration
	shutdownGrace time.Duration
	mode          string
	slowStart     time.Duration
	demo          bool
	demoAgents    string
	demoTTFT      time.Duration
	demoITL       time.Duration
	demoSlots     int
	demoModel     string
	demoPD        string
	logFormat     string
	logLevel      string
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
	fs.IntVar(&o.queueMax, "queue-max", broker.DefaultQueueMax, "jobs waiting per model and pool before 429")
	fs.DurationVar(&o.hbInterval, "heartbeat-interval", broker.DefaultHeartbeatInterval, "agents' heartbeat interval; /readyz waits one")
	fs.DurationVar(&o.reqTimeout, "request-timeout", broker.DefaultRequestTimeout, "deadline of a request")
	fs.DurationVar(&o.stallTimeout, "stall-timeout", broker.DefaultStallTimeout, "end a request whose agent sends nothing for this long")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 30*time.Second, "on SIGTERM, time for in-flight streams to finish")
	fs.StringVar(&o.mode, "dispatch-mode", "capacity", "route weights: capacity, paired or count")
	fs.DurationVar(&o.slowStart, "slow-start", dispatch.DefaultSlowStart, "ramp of a new agent's slots from the floor to full (0 disables)")
	fs.BoolVar(&o.demo, "demo", false, "also run simulated agents in-process")
	fs.StringVar(&o.demoAgents, "demo-agents", "regular=2", "demo agents per pool, e.g. regular=2,prefill=1,decode=1")
	fs.StringVar(&o.demoModel, "demo-model", "sim-model", "model the demo agents serve")
	fs.StringVar(&o.demoPD, "demo-pd-protocol", "vllm", "PD hand-off of demo prefill and decode agents: vllm or sglang")
	fs.DurationVar(&o.demoTTFT, "demo-ttft", 20*time.Millisecond, "demo engines' base time to first token")
	fs.DurationVar(&o.demoITL, "demo-itl", 10*time.Millisecond, "demo engines' inter-token latency")
	fs.IntVar(&o.demoSlots, "demo-slots", 8, "demo agents' slots")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := cli.ApplyEnv(fs, getenv); err != nil {
		return nil, err
	}
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
	mode, err := dispatch.ParseMode(o.mode)
	if err != nil {
		return err
	}
	dcfg := dispatch.DefaultConfig()
	dcfg.Mode = mode
	dcfg.SlowStart = o.slowStart
	demo := map[string]int{}
	if o.demo {
		if demo, err = demoSpec(o.demoAgents); err != nil {
			return err
		}
	}

	var ns *server.Server
	natsURL := o.natsURL
	var natsOpts []nats.Option
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
	connect := func(name string) (*nats.Conn, error) {
		opts := append([]nats.Option{
			nats.Name(name),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					log.Warn("NATS disconnected", "conn", name, "err", err)
				}
			}),
			nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "conn", name, "url", c.ConnectedUrlRedacted()) }),
		}, natsOpts...)
		return nats.Connect(natsURL, opts...)
	}
	nc, err := connect("switchyard-broker")
	if err != nil {
		return fmt.Errorf("connect NATS %s: %w", natsURL, err)
	}
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
		QueueMax:          o.queueMax,
		HeartbeatInterval: o.hbInterval,
		RequestTimeout:    o.reqTimeout,
		StallTimeout:      o.stallTimeout,
		Dispatch:          dcfg,
	}, broker.WithLogger(log), broker.WithMetrics(metrics))
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
	if err := b.EnsureStream(ctx); err != nil {
		return err
	}

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

	ingress := openaihttp.New(b, openaihttp.Config{
		MaxBody: o.maxBody,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
	}, openaihttp.WithLogger(log))
	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	srv := &http.Server{
		Handler:           ingress,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve(ln) }()
	log.Info("broker ready", "http", ln.Addr().String(), "nats", natsURL, "id", b.ID(), "demo_agents", o.demo)
	fmt.Fprintf(stdout, "switchyard broker listening: http=http://%s nats=%s\n", ln.Addr(), natsURL)

	select {
	case <-ctx.Done():
	case err := <-httpDone:
		return fmt.Errorf("http server: %w", err)
	}
	log.Info("shutting down", "grace", o.shutdownGrace)
	graceCtx, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(graceCtx); err != nil {
		log.Warn("streams cut at the end of the grace period", "err", err)
		_ = srv.Close()
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
	opts := &server.Options{
		ServerName: "switchyard-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		MaxPayload: int32(o.maxPayload),
		NoSigs:     true,
		NoLog:      true,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not start")
	}
	log.Info("embedded NATS running", "url", ns.ClientURL(), "store", dir, "max_payload", o.maxPayload)
	return ns, nil
}
