package main

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
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/simengine"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sim-engine:", err)
		os.Exit(1)
	}
}

// shutdownTimeout bounds how long in-flight requests may take to finish
// once the server is asked to stop.
const shutdownTimeout = 10 * time.Second

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim-engine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := simengine.DefaultConfig()
	cfg := def
	cfg.Batch = simengine.DefaultBatchModel()
	listen := fs.String("listen", "127.0.0.1:8000", "address to listen on")
	grpcListen := fs.String("grpc-listen", "", "address to serve vLLM's gRPC engine service (vllm.grpc.engine.VllmEngine) on; empty: off")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.Model, "model", def.Model, "served model name")
	fs.DurationVar(&cfg.TTFT, "ttft", def.TTFT, "base latency before the first token")
	fs.DurationVar(&cfg.PrefillPerToken, "prefill-per-token", def.PrefillPerToken, "latency added before the first token per prompt token")
	fs.DurationVar(&cfg.ITL, "itl", def.ITL, "delay between tokens")
	fs.IntVar(&cfg.Slots, "slots", def.Slots, "concurrent sequences (an engine's max-num-seqs); more requests wait in a FIFO queue")
	cfg.Batch.RegisterFlags(fs, "")
	role := fs.String("role", string(def.Role), "PD role: regular, prefill or decode")
	protocol := fs.String("pd-protocol", string(def.PDProtocol), "PD hand-off protocol of a prefill or decode engine: vllm or sglang")
	fs.StringVar(&cfg.BootstrapHost, "bootstrap-host", def.BootstrapHost, "host a prefill engine's bootstrap side channel listens on and advertises")
	fs.IntVar(&cfg.BootstrapPort, "bootstrap-port", def.BootstrapPort, "port of a prefill engine's bootstrap side channel (0: any free port)")
	fs.DurationVar(&cfg.BootstrapTimeout, "bootstrap-timeout", def.BootstrapTimeout, "how long a decode engine waits to reach its prefill (SGLang: for the room to appear)")
	fs.DurationVar(&cfg.KVHoldTimeout, "kv-hold-timeout", def.KVHoldTimeout, "how long a prefill engine holds a hand-off's KV blocks that no decode reads (vLLM NIXL's lease)")
	prefixCaching := fs.Bool("enable-prefix-caching", false, "cache prompt prefixes as vLLM's automatic prefix caching does: only uncached prompt tokens cost --prefill-per-token")
	fs.IntVar(&cfg.PrefixCacheBlocks, "prefix-cache-blocks", simengine.DefaultPrefixCacheBlocks, "blocks the prefix cache holds (LRU), with --enable-prefix-caching")
	fs.IntVar(&cfg.PrefixBlockSize, "block-size", affinity.DefaultBlockSize, "prompt tokens (words) per prefix cache block")
	kvEvents := fs.String("kv-events-config", "", `publish the prefix cache's KV events as vLLM does, its JSON: {"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":""} (port 0: any free port)`)
	fs.StringVar(&cfg.KVHash, "kv-events-hash", simengine.KVHashBroker, "how prefix cache blocks are named, in KV events too: broker (prompt words, by the broker's block keys: agents forward them as they are) or tokens (as real vLLM: token ids of the simulator's tokenizer over a ChatML template, hashed with a per-process seed; agents need --kv-events-hash vllm to translate them)")
	fs.Var((*simengine.LoadTime)(&cfg.LoadTime), "load-time", "how long the engine loads after start: until then /health, /v1/models and completions answer 503 (gRPC: Unavailable); a `duration`, or never (0: loaded at once)")

	if err := applyEnv(fs, getenv); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Role, cfg.PDProtocol = simengine.Role(*role), simengine.PDProtocol(*protocol)
	if !*prefixCaching {
		cfg.PrefixCacheBlocks = 0
	}
	kv, err := kvevents.ParseConfig(*kvEvents)
	if err != nil {
		return fmt.Errorf("-kv-events-config: %w", err)
	}
	cfg.KVEvents = kv

	eng, err := simengine.New(cfg, simengine.WithLogger(log))
	if err != nil {
		return err
	}
	defer func() {
		if err := eng.Close(); err != nil {
			log.Warn("closing the bootstrap server", "error", err)
		}
	}()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	var (
		gln net.Listener
		gs  *grpc.Server
	)
	if *grpcListen != "" {
		if gln, err = net.Listen("tcp", *grpcListen); err != nil {
			_ = ln.Close()
			return fmt.Errorf("-grpc-listen: %w", err)
		}
		gs = eng.GRPCServer()
	}
	srv := &http.Server{
		Handler:           eng.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	// The bound addresses are logged so that a caller passing port 0 learns
	// them.
	attrs := []any{"addr", ln.Addr().String(), "model", cfg.Model}
	if b := cfg.Batch; b.Enabled {
		attrs = append(attrs, "batch_model", true, "max_batched_tokens", b.MaxBatchedTokens, "step_time", b.StepTime,
			"step_per_seq", b.StepPerSeq, "step_per_prefill_token", b.StepPerPrefillToken)
		if eng.Role() == simengine.RoleDecode {
			attrs = append(attrs, "kv_transfer_per_token", b.KVTransferPerToken)
		}
	} else {
		attrs = append(attrs, "ttft", cfg.TTFT, "prefill_per_token", cfg.PrefillPerToken, "itl", cfg.ITL)
	}
	attrs = append(attrs, "slots", cfg.Slots, "role", eng.Role(), "load_time", (*simengine.LoadTime)(&cfg.LoadTime).String())
	if gln != nil {
		attrs = append(attrs, "grpc_addr", gln.Addr().String())
	}
	if eng.Role() != simengine.RoleRegular {
		attrs = append(attrs, "pd_protocol", eng.PDProtocol())
	}
	if eng.Role() == simengine.RolePrefill {
		attrs = append(attrs, "kv_hold_timeout", cfg.KVHoldTimeout)
	}
	if cfg.PrefixCacheBlocks > 0 {
		attrs = append(attrs, "prefix_cache_blocks", cfg.PrefixCacheBlocks, "block_size", cfg.PrefixBlockSize)
	}
	if ep := eng.KVEventsEndpoint(); ep != "" {
		attrs = append(attrs, "kv_events_endpoint", ep)
	}
	if a := eng.BootstrapAddr(); a != "" {
		attrs = append(attrs, "bootstrap_addr", a, "engine_id", eng.EngineID())
	}
	log.Info("listening", attrs...)
	if cfg.LoadTime > 0 && cfg.LoadTime != simengine.LoadNever {
		t := time.AfterFunc(cfg.LoadTime, func() { log.Info("loaded", "model", cfg.Model) })
		defer t.Stop()
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	grpcErr := make(chan error, 1)
	if gs != nil {
		go func() { grpcErr <- gs.Serve(gln) }()
	}

	select {
	case err := <-serveErr:
		if gs != nil {
			gs.Stop()
		}
		return err
	case err := <-grpcErr:
		_ = srv.Close()
		return fmt.Errorf("grpc: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if gs != nil {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-sctx.Done():
			gs.Stop()
			log.Warn("forced grpc shutdown")
		}
	}
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		log.Warn("forced shutdown", "error", err)
	}
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// applyEnv sets flag defaults from SIM_ENGINE_* variables.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := "SIM_ENGINE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s: %w", name, e)
			}
		}
	})
	return err
}
