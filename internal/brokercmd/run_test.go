package brokercmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

var listening = regexp.MustCompile(`http=http://(\S+) `)

// TestRunDemo runs the command's steps together: the embedded server, the
// broker, a demo agent and the ingresses. A chat request is answered by
// the demo agent; when ctx ends, Run stops everything and returns nil.
func TestRunDemo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout testwait.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
			"--heartbeat-interval", "100ms", "--slow-start", "0", "--log-level", "error",
			"--demo", "--demo-agents", "regular=1", "--demo-ttft", "1ms", "--demo-itl", "1ms"}, func(string) string { return "" }, &stdout, io.Discard)
	}()
	var addr string
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		m := listening.FindStringSubmatch(stdout.String())
		if m == nil {
			return errors.New("not listening yet")
		}
		addr = m[1]
		return nil
	})
	testwait.For(t, 30*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"chat.completion"`) {
			return fmt.Errorf("%d %s", resp.StatusCode, body)
		}
		return nil
	})
	http.DefaultClient.CloseIdleConnections()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestRunPortTaken: a taken HTTP port is Run's error, after the demo
// agents it started have stopped.
func TestRunPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), []string{"--http", ln.Addr().String(), "--grpc", "", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
			"--log-level", "error", "--demo", "--demo-agents", "regular=1"}, func(string) string { return "" }, io.Discard, io.Discard)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "already in use") {
			t.Fatalf("Run: %v, want the taken port", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return with a taken port")
	}
}
