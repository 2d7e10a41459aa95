package cmdtest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestStartBroker: the broker command comes up ready on random ports, its
// demo agent becomes eligible, and it stops cleanly with the test.
func TestStartBroker(t *testing.T) {
	b := cmdtest.StartBroker(t, "--demo", "--demo-agents", "regular=1")
	if !strings.HasPrefix(b.HTTP, "http://127.0.0.1:") || !strings.HasPrefix(b.NATS, "nats://127.0.0.1:") || b.GRPC == "" {
		t.Fatalf("addresses: http %q, nats %q, grpc %q", b.HTTP, b.NATS, b.GRPC)
	}
	cmdtest.WaitEligible(t, b.HTTP, "demo-regular-1")
	if err := b.Exited(); err != nil {
		t.Fatalf("Exited while running: %v", err)
	}
	if err := b.Stop(t); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// TestProc: a command sees no environment, its output is readable while
// it runs, and Cancel, Done, Result and Exited tell its end.
func TestProc(t *testing.T) {
	run := func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		fmt.Fprintf(stdout, "args %v, HOME %q\n", args, getenv("HOME"))
		fmt.Fprintln(stderr, "a log line")
		<-ctx.Done()
		return nil
	}
	p := cmdtest.Start(t, run, "--x", "1")
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if !strings.Contains(p.Err.String(), "a log line") {
			return fmt.Errorf("stderr %q", p.Err.String())
		}
		return nil
	})
	if got := p.Out.String(); got != "args [--x 1], HOME \"\"\n" {
		t.Errorf("stdout %q", got)
	}
	if err := p.Exited(); err != nil {
		t.Fatalf("Exited while running: %v", err)
	}
	p.Cancel()
	<-p.Done()
	if err := p.Result(); err != nil {
		t.Errorf("Result %v, want nil", err)
	}
	if err := p.Exited(); err == nil {
		t.Error("Exited after the end: nil, want an error saying it returned")
	}
}

func TestWaitHealthy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	cmdtest.WaitHealthy(t, srv.URL)
}

func TestTail(t *testing.T) {
	tests := []struct {
		name, s string
		n       int
		want    string
	}{
		{"short", "a\nb\n", 10, "a\nb\n"},
		{"cut at a line", "first line\nsecond\nthird\n", 10, "[…]\nthird\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := cmdtest.Tail(tc.s, tc.n); got != tc.want {
				t.Errorf("Tail(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
			}
		})
	}
}
