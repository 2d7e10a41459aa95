// Command worker-agent runs beside one inference engine (one per GPU node):
// it heartbeats the engine's capacity on NATS, pulls jobs for its model and
// pool only while it has free slots, calls the engine and streams tokens
// back to the broker. SIGTERM drains it: it stops pulling, finishes what it
// holds and exits 0.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "worker-agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return agentcmd.Run(ctx, args, getenv, stdout, stderr)
}
