// Command loadgen benchmarks an OpenAI-compatible streaming endpoint
// (Switchyard, a sim-engine, vLLM, a proxy in front of engines) and reports
// what vLLM's benchmark_serving.py reports: TTFT, ITL, TPOT and end-to-end
// latency percentiles, request, token and goodput throughput, and errors
// by kind. For example
//
//	loadgen --url http://127.0.0.1:8080 --model sim-model --concurrency 64 --requests 2000 --warmup 100
//	loadgen --url http://127.0.0.1:8080 --model sim-model --rate 20 --concurrency 256 --duration 60s --slo ttft=200ms,tpot=50ms --json
//
// The work is done by package loadgen, which benchmarks and scenario tests
// call in-process.
package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/switchyard-ai/switchyard/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// run parses flags only: a benchmark's settings belong on its command line,
// where they are recorded with its results. getenv is unused for that
// reason.
func run(ctx context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadgen.Config
	fs.StringVar(&cfg.URL, "url", "http://127.0.0.1:8080", "base URL of the server; /v1/chat/completions or /v1/completions is appended")
	api := fs.String("api", "chat", "API: chat or completion")
	fs.StringVar(&cfg.Model, "model", "", "model name sent with each request (required)")
	fs.StringVar(&cfg.APIKey, "api-key", "", "sent as Authorization: Bearer")
	fs.IntVar(&cfg.Concurrency, "concurrency", 0, "closed-loop workers; with --rate, the cap on requests in flight (default 1 without --rate)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "Poisson arrivals in requests/s (inf: all at once)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the arrivals and synthetic prompts")
	fs.IntVar(&cfg.Requests, "requests", 0, "measured requests to send (default 100 without --duration)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "stop issuing requests after this measured time")
	warmup := fs.String("warmup", "0", "warm-up excluded from the stats: a request count or a duration")
	prompt := fs.String("prompt-tokens", "fixed:128", "synthetic prompt words: fixed:N, uniform:A-B or N")
	maxTok := fs.String("max-tokens", "fixed:128", "max_tokens: fixed:N, uniform:A-B or N")
	prompts := fs.String("prompts", "", "JSONL file of {\"prompt\"|\"messages\", optional \"max_tokens\"}, sent in order and cycled")
	slo := fs.String("slo", "", "goodput SLOs, such as ttft=200ms,tpot=50ms,e2e=2s (plain numbers are ms)")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "bound on each request (0: none)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	rawOut := fs.String("raw-out", "", "write one JSON line per request to this file (times, tokens, route, error)")
	caFile := fs.String("ca-file", "", "PEM file of the certificate authorities to trust for an https --url (a broker with a private CA); default: the system's")
	progress := fs.Bool("progress", false, "draw a progress bar on stderr even when it is not a terminal")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	cfg.API = loadgen.API(*api)
	if cfg.Rate == 0 && cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.Requests == 0 && cfg.Duration == 0 {
		cfg.Requests = 100
	}
	if n, err := strconv.Atoi(*warmup); err == nil {
		cfg.WarmupRequests = n
	} else if d, derr := time.ParseDuration(*warmup); derr == nil {
		cfg.WarmupDuration = d
	} else {
		return fmt.Errorf("--warmup %q: want a request count or a duration", *warmup)
	}
	var err error
	if cfg.MaxTokens, err = loadgen.ParseDist(*maxTok); err != nil {
		return fmt.Errorf("--max-tokens: %w", err)
	}
	if cfg.SLO, err = loadgen.ParseSLO(*slo); err != nil {
		return fmt.Errorf("--slo: %w", err)
	}
	if *prompts != "" {
		if set["prompt-tokens"] {
			return errors.New("--prompts and --prompt-tokens are exclusive")
		}
		f, err := os.Open(*prompts)
		if err != nil {
			return err
		}
		cfg.Prompts, err = loadgen.ReadPrompts(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("--prompts %s: %w", *prompts, err)
		}
	} else if cfg.PromptTokens, err = loadgen.ParseDist(*prompt); err != nil {
		return fmt.Errorf("--prompt-tokens: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	var opts []loadgen.Option
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--ca-file %s: no PEM certificate in it", *caFile)
		}
		opts = append(opts, loadgen.WithRootCAs(pool))
	}
	if *progress || isTerminal(stderr) {
		opts = append(opts, loadgen.WithProgress(stderr, 250*time.Millisecond))
	}
	var raw *os.File
	if *rawOut != "" {
		if raw, err = os.Create(*rawOut); err != nil {
			return err
		}
		opts = append(opts, loadgen.WithRawOut(raw))
	}
	rep, runErr := loadgen.Run(ctx, cfg, opts...)
	if raw != nil {
		runErr = errors.Join(runErr, raw.Close())
	}
	if rep == nil {
		return runErr
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteTable(stdout)
	}
	return errors.Join(runErr, err)
}

// isTerminal reports whether w is a character device, without x/term.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
