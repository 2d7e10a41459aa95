// Package agentcmd is the worker-agent command; cmd/worker-agent is its main.
package agentcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/openai"
	"github.com/switchyard-ai/switchyard/agent/engine/sim"
	"github.com/switchyard-ai/switchyard/internal/cli"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/subjects"
)

type options struct {
	natsURL   string
	engine    string
	engineURL string
	engineKey string
	role      string
	model     string
	slots     int
	heartbeat time.Duration
	id        string
	prefix    string
	simTTFT   time.Duration
	simITL    time.Duration
	logFormat string
	logLevel  string
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("worker-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.natsURL, "nats-url", nats.DefaultURL, "NATS server URLs, comma-separated (the broker's embedded server or a cluster)")
	fs.StringVar(&o.engine, "engine", "openai", "engine adapter: openai (any OpenAI-compatible server) or sim (in-process simulator)")
	fs.StringVar(&o.engineURL, "engine-url", "http://127.0.0.1:8000", "engine base URL (openai adapter)")
	fs.StringVar(&o.engineKey, "engine-api-key", "", "API key sent to the engine as a Bearer token")
	fs.StringVar(&o.role, "role", subjects.PoolRegular, "pool this agent serves: regular")
	fs.StringVar(&o.model, "model", "", "model id to serve (default: the engine's first model from /v1/models)")
	fs.IntVar(&o.slots, "slots", agent.DefaultSlots, "jobs held at once (the engine's useful concurrency)")
	fs.DurationVar(&o.heartbeat, "heartbeat", agent.DefaultHeartbeat, "heartbeat interval")
	fs.StringVar(&o.id, "id", "", "agent id (default hostname-pid)")
	fs.StringVar(&o.prefix, "prefix", subjects.DefaultPrefix, "first token(s) of every NATS subject")
	fs.DurationVar(&o.simTTFT, "sim-ttft", 20*time.Millisecond, "sim engine: base time to first token")
	fs.DurationVar(&o.simITL, "sim-itl", 10*time.Millisecond, "sim engine: inter-token latency")
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
	if o.role != subjects.PoolRegular {
		return fmt.Errorf("role %q: this build serves regular", o.role)
	}
	var (
		eng       agent.Engine
		transport string
	)
	switch o.engine {
	case "sim":
		model := o.model
		if model == "" {
			model = "sim-model"
		}
		o.model = model
		se, err := simengine.New(simengine.Config{Model: model, TTFT: o.simTTFT, ITL: o.simITL, Slots: o.slots})
		if err != nil {
			return err
		}
		eng, transport = sim.New(se), "inproc"
	case "openai":
		var aopts []openai.Option
		if o.engineKey != "" {
			aopts = append(aopts, openai.WithAPIKey(o.engineKey))
		}
		oa, err := openai.New(o.engineURL, o.slots, aopts...)
		if err != nil {
			return err
		}
		if o.model == "" {
			if o.model, err = firstModel(ctx, oa); err != nil {
				return err
			}
		}
		eng, transport = oa, "http"
	default:
		return fmt.Errorf("engine %q: want openai or sim", o.engine)
	}

	nc, err := nats.Connect(o.natsURL,
		nats.Name("switchyard-agent"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
	)
	if err != nil {
		return fmt.Errorf("connect NATS %s: %w", o.natsURL, err)
	}
	defer nc.Close()
	a, err := agent.New(nc, eng, agent.Config{
		ID: o.id, Model: o.model, Pool: o.role, Slots: o.slots, Heartbeat: o.heartbeat,
		Prefix: o.prefix, Engine: o.engine, Transport: transport,
	}, agent.WithLogger(log))
	if err != nil {
		return err
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
func firstModel(ctx context.Context, oa *openai.Adapter) (string, error) {
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
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("engine models: %w", errors.Join(err, ctx.Err()))
		case <-time.After(delay):
		}
	}
}
