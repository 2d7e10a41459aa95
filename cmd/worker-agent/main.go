// Command worker-agent runs beside one inference engine (one per GPU node):
// it heartbeats the engine's capacity on NATS, pulls jobs for its model and
// pool only while it has free slots, calls the engine and streams tokens
// back to the broker. SIGTERM drains it: it stops pulling, finishes what it
// holds and exits 0.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "worker-agent:", err)
		os.Exit(1)
	}
}
