package natsauth_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestEmbeddedShippedConfig: the broker's embedded server runs the shipped
// configuration as the deploy README says (--nats-config), with
// --nats-listen winning over the file's listen and its store in
// --data-dir, not the file's store_dir; the system account answers there
// too.
func TestEmbeddedShippedConfig(t *testing.T) {
	for k, v := range passwords {
		t.Setenv(k, v)
	}
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := &testwait.Buffer{}, &testwait.Buffer{}
	done := make(chan error, 1)
	getenv := func(k string) string {
		if k == "SWITCHYARD_NATS_PASSWORD" {
			return passwords["SY_NATS_BROKER_PASSWORD"]
		}
		return ""
	}
	go func() {
		done <- brokercmd.Run(ctx, []string{"--nats-config", shippedConfig, "--nats-listen", "127.0.0.1:0", "--data-dir", dataDir,
			"--nats-user", "broker-1", "--id", "broker-1", "--http", "127.0.0.1:0", "--grpc", "",
			"--heartbeat-interval", "100ms", "--log-level", "info"}, getenv, out, logs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("broker: %v", err)
		}
	})

	listening := regexp.MustCompile(`http=(\S+) nats=(\S+)`)
	var httpURL, natsURL string
	testwait.For(t, 60*time.Second, 20*time.Millisecond, func() error {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("broker exited: %v\n%s", err, logs.String())
		default:
		}
		m := listening.FindStringSubmatch(out.String())
		if m == nil {
			return fmt.Errorf("broker not listening yet")
		}
		httpURL, natsURL = m[1], m[2]
		return nil
	})
	testwait.Status(t, nil, httpURL+"/readyz", http.StatusOK)
	if !strings.HasPrefix(natsURL, "nats://127.0.0.1:") || strings.HasSuffix(natsURL, ":4222") {
		t.Errorf("embedded NATS on %s, want --nats-listen's random loopback port", natsURL)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "jetstream")); err != nil {
		t.Errorf("JetStream store not in --data-dir: %v", err)
	}
	if !strings.Contains(logs.String(), "not the configuration's store_dir") {
		t.Errorf("the broker does not say it ignores the file's store_dir; logs:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "SECURITY WARNING") {
		t.Errorf("loopback server with users warned:\n%s", logs.String())
	}

	nc, err := nats.Connect(natsURL, nats.UserInfo("sys", passwords["SY_NATS_SYS_PASSWORD"]), nats.CustomInboxPrefix("_INBOX.sys"))
	if err != nil {
		t.Fatalf("system user: %v", err)
	}
	defer nc.Close()
	// The jobs stream, the directed queues' stream, and the Files and
	// Batches APIs' Object Store and KV bucket, which the broker makes
	// under the shipped permissions.
	testwait.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		m, err := nc.Request("$SYS.REQ.SERVER.PING.JSZ", nil, 5*time.Second)
		if err != nil {
			return fmt.Errorf("system account: %w", err)
		}
		if !strings.Contains(string(m.Data), `"streams":4`) {
			return fmt.Errorf("JSZ = %.300s, want 4 streams", m.Data)
		}
		return nil
	})
}
