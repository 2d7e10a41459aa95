// Package agentcmd is the worker-agent command; cmd/worker-agent is its main.
package agentcmd

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/credentials"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/openai"
	"github.com/switchyard-ai/switchyard/agent/engine/pd"
	"github.com/switchyard-ai/switchyard/agent/engine/sim"
	"github.com/switchyard-ai/switchyard/agent/engine/vllmgrpc"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/cli"
	"github.com/switchyard-ai/switchyard/internal/natsauth"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

type options struct {
	natsURL      string
	engine       string
	engineURL    string
	engineKey    string
	headerWait   time.Duration
	role         string
	model        string
	slots        int
	heartbeat    time.Duration
	drainTimeout time.Duration
	id           string
	prefix       string
	simTTFT      time.Duration
	simITL       time.Duration
	simPrefill   time.Duration
	simLoad      time.Duration
	simBatch     simengine.BatchModel
	pdProto      string
	bsHost       string
	bsPort       int
	closers      []func() error
	tokenizer    string
	grpcTLS      bool
	natsAuth     *natsauth.ClientFlags
	metrics      string
	logFormat    string
	logLevel     string
	pdLabels     string
	slowStart    time.Duration
	slowFloor    float64
	keepalive    time.Duration
	maxAnswer    int64
	firstEvent   time.Duration
	progress     time.Duration
	replyLinger  time.Duration
	kvHold       time.Duration
	kvEvents     string
	kvTopic      string
	kvHash       string
	kvBlockSize  int
	affBlockSize int
	tokenizerFor agent.PromptTokenizer // the HTTP engine, for --kv-events-hash vllm
	noDirected   bool
	noBatch      bool
	batchReserve int
	batchMax     int
	noPreempt    bool
	log          *slog.Logger
	pending      *pending // announces the agent while its model is not known
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("worker-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.natsURL, "nats-url", nats.DefaultURL, "NATS server URLs, comma-separated (the broker's embedded server or a cluster)")
	fs.StringVar(&o.engine, "engine", "openai", "engine adapter: openai (any OpenAI-compatible server), vllm, sglang (OpenAI API plus their PD hand-off), vllm-grpc (vLLM's gRPC engine service), or sim (in-process simulator)")
	fs.StringVar(&o.engineURL, "engine-url", "http://127.0.0.1:8000", "engine base URL; for vllm-grpc the gRPC target host:port")
	fs.StringVar(&o.tokenizer, "tokenizer", "", "vllm-grpc: tokenizer file to detokenize with (default: ask the engine's GetTokenizer)")
	fs.BoolVar(&o.grpcTLS, "engine-grpc-tls", false, "vllm-grpc: connect with TLS (system roots)")
	fs.StringVar(&o.metrics, "metrics-listen", "", "serve the agent's Prometheus /metrics and its /healthz and /readyz probes on this address, e.g. 127.0.0.1:9100 (empty: off)")
	o.natsAuth = natsauth.RegisterClientFlags(fs)
	fs.StringVar(&o.engineKey, "engine-api-key", "", "API key sent to the engine as a Bearer token")
	fs.DurationVar(&o.headerWait, "engine-header-timeout", openai.DefaultHeaderTimeout, "HTTP engines: how long a streaming request waits for the engine's response headers before it fails with a retryable engine_unavailable error, which the broker retries on another agent (0: no bound). vLLM and SGLang send a streaming request's headers as soon as they accept it, before its prefill, so a long prompt's slow first token does not count against it")
	fs.Int64Var(&o.maxAnswer, "max-answer-bytes", agent.DefaultMaxAnswerBytes, "largest engine answer relayed for one request, in bytes (its events' JSON, an embeddings answer, which one NATS message must also carry); past it the engine request is cancelled and the request fails with engine_output_too_large")
	fs.DurationVar(&o.firstEvent, "engine-first-event-timeout", agent.DefaultFirstEventTimeout, "how long an engine request waits for its first event (its prefill, and its wait in the engine's queue) before it is cancelled with a retryable engine_stalled error (0: no bound)")
	fs.DurationVar(&o.progress, "engine-progress-timeout", agent.DefaultProgressTimeout, "how long an engine request may go without an event after its first, whatever else the engine sends (SSE comments, a byte at a time), before it is cancelled with engine_stalled, which the broker retries or migrates (0: no bound)")
	fs.StringVar(&o.role, "role", subjects.PoolRegular, "pool this agent serves: regular, prefill or decode")
	fs.StringVar(&o.pdProto, "pd-protocol", "", "PD hand-off for --engine sim (vllm or sglang); vllm and sglang engines imply theirs")
	fs.StringVar(&o.bsHost, "bootstrap-host", "", "SGLang prefill: host of the engine's bootstrap server as decode engines reach it (default: the engine URL's host)")
	fs.StringVar(&o.pdLabels, "pd-labels", "", "prefill/decode: labels a prefill and a decode agent must share to hand off to each other, k=v,k=v (e.g. kv=nixl,vllm=0.11); with the PD protocol they choose the queues the agent pulls and publishes to")
	fs.DurationVar(&o.kvHold, "kv-hold", agent.DefaultKVHold, "prefill: how long the engine holds a hand-off's KV for its decode leg (vLLM NIXL's lease, VLLM_NIXL_ABORT_REQUEST_TIMEOUT); a decode job taken later is not run and the broker retries the request")
	fs.DurationVar(&o.slowStart, "slow-start", dispatch.DefaultSlowStart, "after the engine becomes ready, ramp the jobs held from the floor up to --slots over this long, as the broker's --slow-start weighs the agent (0: off)")
	fs.Float64Var(&o.slowFloor, "slow-start-floor", dispatch.DefaultSlowStartFloor, "fraction of --slots held at the start of the slow-start ramp (at least one job)")
	fs.DurationVar(&o.replyLinger, "reply-linger", agent.DefaultReplyLinger, "when the agent sends replies more often than this, a chunk waits up to this long for others to the same broker (one message, one wake-up of the broker for them), a token at most half its stream's inter-token time; an attempt's first token and its end never wait, and a quiet agent sends each chunk at once (0: off)")
	fs.DurationVar(&o.keepalive, "keepalive", agent.DefaultKeepalive, "while a job has no token yet (a long prefill, a busy engine, a decode waiting for its KV), tell the broker this often that the engine is working; keep it well under the broker's --stall-timeout (30s) (0: off)")
	fs.StringVar(&o.kvEvents, "kv-events-endpoint", "", "forward the engine's KV-cache events (its vLLM --kv-events-config endpoint, e.g. tcp://127.0.0.1:5557) to the brokers for precise prefix-cache affinity, their block hashes as --kv-events-hash says (empty: off)")
	fs.StringVar(&o.kvHash, "kv-events-hash", agent.KVHashBroker, "what the engine's KV-event block hashes are: broker (the broker's block keys, as sim-engine's are by default) or vllm (hashes of token ids, as vLLM and llm-d-inference-sim publish: the agent tokenizes each prompt with the engine's /tokenize, beside the engine call, and translates them to broker keys)")
	fs.IntVar(&o.kvBlockSize, "kv-block-size", 16, "--kv-events-hash vllm: the engine's block size in tokens (its --block-size) until its first event says")
	fs.IntVar(&o.affBlockSize, "affinity-block-size", 16, "--kv-events-hash vllm: words per prefix block of the brokers' keys; match the brokers' --affinity-block-size")
	fs.StringVar(&o.kvTopic, "kv-events-topic", "", "topic prefix of the engine's KV events (empty: all)")
	fs.BoolVar(&o.noDirected, "no-directed", false, "pull only the pool's shared queue, not this agent's directed queue (prefix-cache affinity offers then reach it through the shared queue after the broker's --affinity-wait)")
	fs.BoolVar(&o.noBatch, "no-batch", false, "pull interactive work only, never the pool's batch queue (Batches API lines, service_tier flex)")
	fs.IntVar(&o.batchReserve, "batch-reserve", 1, "slots batch work never takes, so that interactive work arriving starts at once without preempting batch jobs")
	fs.IntVar(&o.batchMax, "batch-max", 0, "batch jobs held at once at most (0: every slot --batch-reserve leaves)")
	fs.BoolVar(&o.noPreempt, "no-batch-preempt", false, "never preempt a batch job for interactive work: an interactive job that finds no free slot waits for one (regular pool; prefill and decode agents never preempt)")
	fs.IntVar(&o.bsPort, "bootstrap-port", 0, "SGLang prefill: the engine's bootstrap port, its --disaggregation-bootstrap-port (0: read it from the engine's /server_info)")
	fs.StringVar(&o.model, "model", "", "model id to serve (default: the engine's first model from /v1/models)")
	fs.IntVar(&o.slots, "slots", agent.DefaultSlots, "jobs held at once (the engine's useful concurrency)")
	fs.DurationVar(&o.heartbeat, "heartbeat", agent.DefaultHeartbeat, "heartbeat interval")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 0, "on SIGTERM, end the jobs still running after this long with a retryable error, so the broker continues them on other agents, and exit (set it a few seconds under the orchestrator's kill grace, e.g. 25s for Kubernetes' 30s; 0: wait for every job)")
	fs.StringVar(&o.id, "id", "", "agent id (default hostname-pid)")
	fs.StringVar(&o.prefix, "prefix", subjects.DefaultPrefix, "first token(s) of every NATS subject")
	fs.DurationVar(&o.simTTFT, "sim-ttft", 20*time.Millisecond, "sim engine: base time to first token")
	fs.DurationVar(&o.simITL, "sim-itl", 10*time.Millisecond, "sim engine: inter-token latency")
	fs.DurationVar(&o.simPrefill, "sim-prefill-per-token", 0, "sim engine: latency added before the first token per prompt token (long prompts)")
	fs.Var((*simengine.LoadTime)(&o.simLoad), "sim-load-time", "sim engine: how long it loads before it is healthy: a `duration`, or never")
	o.simBatch = simengine.DefaultBatchModel()
	o.simBatch.RegisterFlags(fs, "sim-")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cli.SetUsage(fs, `worker-agent: runs beside one inference engine. It heartbeats the engine's
capacity on NATS, pulls jobs for its model and pool only while it has free
slots, calls the engine and streams tokens back. SIGTERM drains it.

Usage:
  worker-agent --nats-url nats://broker:4222 --engine openai --engine-url http://127.0.0.1:8000
  worker-agent --engine vllm --role prefill --engine-url http://127.0.0.1:8100
  worker-agent --engine sim                  an in-process simulated engine`, []cli.Section{
		{Title: "Engine", Flags: []string{"engine", "engine-url", "engine-api-key", "engine-header-timeout", "engine-first-event-timeout", "engine-progress-timeout", "max-answer-bytes", "model", "slots", "tokenizer", "engine-grpc-tls"}},
		{Title: "Role", Flags: []string{"role", "pd-protocol", "pd-labels", "bootstrap-host", "bootstrap-port", "kv-hold"}},
		{Title: "Prefix-cache affinity", Flags: []string{"kv-events-endpoint", "kv-events-topic", "kv-events-hash", "kv-block-size", "affinity-block-size", "no-directed"}},
		{Title: "Load", Flags: []string{"slow-start", "slow-start-floor", "keepalive", "reply-linger"}},
		{Title: "Batch work", Flags: []string{"no-batch", "batch-reserve", "batch-max", "no-batch-preempt"}},
		{Title: "Shutdown", Flags: []string{"drain-timeout"}},
		{Title: "NATS", Flags: []string{"nats-url", "id", "heartbeat", "prefix",
			"nats-creds", "nats-nkey", "nats-user", "nats-password", "nats-token", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-inbox-prefix"}},
		{Title: "Observability", Flags: []string{"metrics-listen", "log-format", "log-level"}},
		{Title: "Simulator (--engine sim)", Flags: []string{"sim-ttft", "sim-itl", "sim-prefill-per-token", "sim-load-time",
			"sim-batch-model", "sim-max-batched-tokens", "sim-step-time", "sim-step-per-seq", "sim-step-per-prefill-token", "sim-kv-transfer-per-token"}},
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
	return o, nil
}

// Run is the worker-agent command. It returns when ctx ends and the agent
// has drained.
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
	o.log = log
	if _, err := subjects.ConsumerName("m", o.role); err != nil {
		return fmt.Errorf("role %q: want regular, prefill or decode", o.role)
	}
	if _, err := subjects.CanonicalLabels(o.pdLabels); err != nil {
		return fmt.Errorf("--pd-labels: %w", err)
	}
	switch {
	case o.slowStart < 0:
		return fmt.Errorf("--slow-start %s: want 0 (off) or more", o.slowStart)
	case !(o.slowFloor >= 0 && o.slowFloor <= 1):
		return fmt.Errorf("--slow-start-floor %g: want a fraction in [0, 1]", o.slowFloor)
	case o.keepalive < 0:
		return fmt.Errorf("--keepalive %s: want 0 (off) or more", o.keepalive)
	case o.firstEvent < 0 || o.progress < 0:
		return fmt.Errorf("--engine-first-event-timeout and --engine-progress-timeout: want 0 (off) or more")
	case o.maxAnswer < 1:
		return fmt.Errorf("--max-answer-bytes %d: want at least 1", o.maxAnswer)
	case o.replyLinger < 0:
		return fmt.Errorf("--reply-linger %s: want 0 (off) or more", o.replyLinger)
	case o.headerWait < 0:
		return fmt.Errorf("--engine-header-timeout %s: want 0 (no bound) or more", o.headerWait)
	case o.kvHold <= 0:
		return fmt.Errorf("--kv-hold %s: want a positive duration", o.kvHold)
	case o.kvHash != agent.KVHashBroker && o.kvHash != agent.KVHashVLLM:
		return fmt.Errorf("--kv-events-hash %q: want %s or %s", o.kvHash, agent.KVHashBroker, agent.KVHashVLLM)
	case o.kvBlockSize < 1:
		return fmt.Errorf("--kv-block-size %d: want at least 1", o.kvBlockSize)
	case o.affBlockSize < 1:
		return fmt.Errorf("--affinity-block-size %d: want at least 1", o.affBlockSize)
	}
	keepalive := o.keepalive
	if keepalive == 0 {
		keepalive = -1 // off; zero in agent.Config takes the default
	}
	replyLinger := o.replyLinger
	if replyLinger == 0 {
		replyLinger = -1 // off, as keepalive
	}
	natsOpts, err := o.natsAuth.Options()
	if err != nil {
		return err
	}
	// NATS first: an agent whose engine takes minutes to name its model
	// announces itself as warming meanwhile (see pending).
	link := cli.NewNATSLink(log, "switchyard-agent-"+o.id)
	nc, err := nats.Connect(o.natsURL, append(link.Options(), natsOpts...)...)
	if err != nil {
		return fmt.Errorf("connect NATS %s: %w", o.natsURL, err)
	}
	go link.Watch(ctx, nc, o.natsURL, natsOpts)
	defer nc.Close()
	if o.id == "" {
		o.id = agent.DefaultID()
	}
	if o.pending, err = newPending(nc, o); err != nil {
		return err
	}
	// The probes answer from the start: while the engine loads and names
	// its model, /readyz says so.
	var probes *probeServer
	if o.metrics != "" {
		if probes, err = serveProbes(o.metrics, func() error { return link.Err(nc) }, o.pending, log); err != nil {
			return err
		}
		defer probes.stop()
	}
	eng, transport, err := buildEngine(ctx, o)
	defer func() {
		for _, c := range o.closers {
			_ = c()
		}
	}()
	o.pending.done()
	if err != nil {
		return err
	}
	aopts := []agent.Option{agent.WithLogger(log)}
	if o.kvEvents != "" && o.kvHash == agent.KVHashVLLM {
		if o.tokenizerFor == nil {
			return fmt.Errorf("--kv-events-hash vllm needs an HTTP engine (openai, vllm, sglang) to tokenize prompts with")
		}
		aopts = append(aopts, agent.WithTokenizer(o.tokenizerFor))
	}
	a, err := agent.New(nc, eng, agent.Config{
		ID: o.id, Model: o.model, Pool: o.role, Slots: o.slots, Heartbeat: o.heartbeat, DrainTimeout: o.drainTimeout,
		Prefix: o.prefix, Engine: o.engine, Transport: transport,
		PDProtocol: o.pdProto, BootstrapHost: o.bsHost, BootstrapPort: o.bsPort, PDLabels: o.pdLabels,
		SlowStart: o.slowStart, SlowStartFloor: o.slowFloor, Keepalive: keepalive, ReplyLinger: replyLinger, KVHold: o.kvHold,
		KVEvents: o.kvEvents, KVEventsTopic: o.kvTopic, KVEventsHash: o.kvHash, KVBlockSize: o.kvBlockSize, AffinityBlockSize: o.affBlockSize,
		NoDirected: o.noDirected, MaxAnswerBytes: o.maxAnswer,
		NoBatch: o.noBatch, BatchReserve: o.batchReserve, BatchMax: o.batchMax, NoBatchPreempt: o.noPreempt,
		FirstEventTimeout: offIfZero(o.firstEvent), ProgressTimeout: offIfZero(o.progress),
	}, aopts...)
	if err != nil {
		return err
	}
	if probes != nil {
		if err := probes.setAgent(a); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "switchyard agent %s serving %s (%s) on %s\n", a.ID(), o.model, o.role, o.natsURL)
	if err := a.Run(ctx); err != nil {
		return err
	}
	if err := nc.FlushTimeout(2 * time.Second); err != nil {
		log.Warn("NATS flush at exit", "err", err)
	}
	return nil
}

// firstModel asks the engine what it serves, waiting for it to come up.
// Meanwhile it heartbeats as warming under PendingModel, with the reason.
func firstModel(ctx context.Context, oa *openai.Adapter, log *slog.Logger, p *pending) (string, error) {
	p.warming("engine has not named its model yet: asking its /v1/models")
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		models, err := oa.Models(mctx)
		cancel()
		if err == nil && len(models) > 0 {
			return models[0], nil
		}
		if err == nil {
			err = errors.New("engine lists no model")
		}
		// A wrong key looks like an engine still loading unless it is said.
		var we *wire.Error
		if errors.As(err, &we) && (we.GetHttpStatus() == 401 || we.GetHttpStatus() == 403) {
			log.Error("engine refuses the agent's key while asking its models; check --engine-api-key", "err", err)
		} else {
			log.Info("waiting for the engine to list its models (--model skips this)", "err", err)
		}
		reason := "engine has not named its model yet: " + err.Error()
		p.warming(reason)
		if err := p.wait(ctx, delay, reason); err != nil {
			return "", fmt.Errorf("engine models: %w", err)
		}
	}
}

// buildEngine makes the adapter that --engine names, wrapped with the PD
// protocol when the agent serves a prefill or decode pool.
func buildEngine(ctx context.Context, o *options) (agent.Engine, string, error) {
	pdRole := o.role != subjects.PoolRegular
	switch o.engine {
	case "vllm", "sglang":
		o.pdProto = o.engine
	case "vllm-grpc":
		o.pdProto = pd.VLLM
		if pdRole {
			o.bsPort = 0
		}
		return grpcEngine(o)
	case "sim", "openai":
	default:
		return nil, "", fmt.Errorf("engine %q: want openai, vllm, sglang or sim", o.engine)
	}
	if o.engine == "openai" && pdRole {
		return nil, "", fmt.Errorf("role %s needs --engine vllm, sglang or sim: plain OpenAI servers have no PD hand-off", o.role)
	}
	if !pdRole {
		o.pdProto = ""
	} else if o.pdProto != pd.VLLM && o.pdProto != pd.SGLang {
		return nil, "", fmt.Errorf("role %s: --pd-protocol %q: want vllm or sglang", o.role, o.pdProto)
	}
	var (
		inner     agent.Engine
		transport string
	)
	if o.engine == "sim" {
		if o.model == "" {
			o.model = "sim-model"
		}
		cfg := simengine.Config{Model: o.model, TTFT: o.simTTFT, ITL: o.simITL, Slots: o.slots, PrefillPerToken: o.simPrefill, LoadTime: o.simLoad, Batch: o.simBatch}
		if pdRole {
			cfg.Role, cfg.PDProtocol, cfg.BootstrapPort = simengine.Role(o.role), simengine.PDProtocol(o.pdProto), 0
		}
		se, err := simengine.New(cfg)
		if err != nil {
			return nil, "", err
		}
		if o.role == subjects.PoolPrefill && o.pdProto == pd.SGLang {
			o.bsHost, o.bsPort = se.BootstrapHost(), se.BootstrapPort()
		}
		o.closers = append(o.closers, se.Close) // after the agent drained
		inner, transport = sim.New(se), "inproc"
	} else {
		aopts := []openai.Option{openai.WithHeaderTimeout(o.headerWait)}
		if o.engineKey != "" {
			aopts = append(aopts, openai.WithAPIKey(o.engineKey))
		}
		if o.model == "" {
			probe, err := openai.New(o.engineURL, 1, aopts...)
			if err != nil {
				return nil, "", err
			}
			if o.model, err = firstModel(ctx, probe, o.log, o.pending); err != nil {
				return nil, "", err
			}
		}
		// The health probe checks the key and that the engine serves the
		// model: a misconfigured agent never becomes ready.
		oa, err := openai.New(o.engineURL, o.slots, append(aopts, openai.WithModel(o.model))...)
		if err != nil {
			return nil, "", err
		}
		if o.bsHost == "" {
			if u, err := url.Parse(o.engineURL); err == nil {
				o.bsHost = u.Hostname()
			}
		}
		if o.role == subjects.PoolPrefill && o.pdProto == pd.SGLang && o.bsPort == 0 {
			if o.bsPort, err = discoverBootstrapPort(ctx, oa, o.log); err != nil {
				return nil, "", err
			}
		}
		inner, transport = oa, "http"
		o.tokenizerFor = oa
	}
	if !pdRole {
		return inner, transport, nil
	}
	if o.role != subjects.PoolPrefill || o.pdProto != pd.SGLang {
		o.bsPort = 0
	} else {
		o.bsHost = bracketHost(o.bsHost)
		warnLoopbackBootstrap(o.log, o.bsHost, o.natsURL)
	}
	wrapped, err := pd.New(inner, o.pdProto, pd.WithBootstrap(o.bsHost, o.bsPort))
	if err != nil {
		return nil, "", err
	}
	return wrapped, transport, nil
}

// grpcEngine builds the vllm-grpc adapter; it serves the vLLM PD roles
// itself (kv_transfer_params in the Generate request).
func grpcEngine(o *options) (agent.Engine, string, error) {
	target := strings.TrimPrefix(strings.TrimPrefix(o.engineURL, "grpc://"), "http://")
	var gopts []vllmgrpc.Option
	if o.tokenizer != "" {
		gopts = append(gopts, vllmgrpc.WithTokenizerFile(o.tokenizer))
	}
	if o.grpcTLS {
		gopts = append(gopts, vllmgrpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
	}
	a, err := vllmgrpc.New(target, gopts...)
	if err != nil {
		return nil, "", err
	}
	o.closers = append(o.closers, a.Close)
	if o.model == "" {
		return nil, "", fmt.Errorf("engine vllm-grpc: --model is required")
	}
	return a, "grpc", nil
}

// probeServer serves the agent's /metrics, /healthz and /readyz
// (--metrics-listen) from the agent's start; the agent's own metrics and
// state join once it is built (setAgent).
type probeServer struct {
	reg   *prometheus.Registry
	srv   *http.Server
	agent atomic.Pointer[agent.Agent]
}

// setAgent makes the probes report a and its metrics.
func (p *probeServer) setAgent(a *agent.Agent) error {
	if err := a.Metrics().Register(p.reg); err != nil {
		return err
	}
	p.agent.Store(a)
	return nil
}

func (p *probeServer) stop() { _ = p.srv.Close() }

// serveProbes serves the agent's /metrics and probes until stop. Before
// the agent is built, /readyz is 503 with what the agent waits for: its
// engine to name the model (pending), or its start.
func serveProbes(addr string, natsErr func() error, pend *pending, log *slog.Logger) (*probeServer, error) {
	p := &probeServer{reg: prometheus.NewRegistry()}
	p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg := p.reg
	ln, err := cli.Listen("agent metrics", addr, "metrics-listen")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	// Liveness: the process answers. Readiness: it pulls jobs, which needs
	// NATS and a healthy engine; the body says why not.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if err := natsErr(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: NATS: %v\n", err)
			return
		}
		a := p.agent.Load()
		if a == nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %s: %s\n", wire.StateWarming, pend.why())
			return
		}
		if st := a.State(); st != wire.StateReady {
			w.WriteHeader(http.StatusServiceUnavailable)
			if why := a.StateReason(); why != "" {
				st += ": " + why
			}
			_, _ = fmt.Fprintf(w, "not ready: %s\n", st)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server", "err", err)
		}
	}()
	log.Info("agent metrics", "addr", ln.Addr().String())
	return p, nil
}

// offIfZero turns a flag's 0 (no bound) into agent.Config's "off", where
// zero takes the default.
func offIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
