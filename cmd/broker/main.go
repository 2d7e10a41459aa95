// Command broker is Switchyard's entry point: OpenAI-compatible HTTP in
// front, NATS JetStream behind, capacity-weighted dispatch between the
// regular pool and the prefill/decode pipeline. Without --nats-url it runs
// an embedded NATS server that agents on other nodes can join; with --demo
// it also runs simulated agents, so
//
//	go run ./cmd/broker --demo
//
// is a complete system ready for curl on 127.0.0.1:8080.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/switchyard-ai/switchyard/internal/brokercmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return brokercmd.Run(ctx, args, getenv, stdout, stderr)
}
