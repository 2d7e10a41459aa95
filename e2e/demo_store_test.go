package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// TestDemoRemovesItsStore: a demo broker with no --data-dir keeps its
// embedded NATS store under $TMPDIR while it runs and removes it on exit.
func TestDemoRemovesItsStore(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	p := cmdtest.Start(t, brokerRun, "--demo", "--demo-agents", "regular=1", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0", "--heartbeat-interval", "100ms", "--log-level", "warn")
	cmdtest.WaitBroker(t, p.Out, p.Exited)
	stores, _ := filepath.Glob(filepath.Join(tmp, "switchyard-nats-*"))
	if len(stores) != 1 {
		t.Fatalf("stores under $TMPDIR while running: %v, want one", stores)
	}
	if err := p.Stop(t); err != nil {
		t.Fatalf("broker returned %v", err)
	}
	if _, err := os.Stat(stores[0]); !os.IsNotExist(err) {
		t.Errorf("store %s still there after exit (stat: %v)", stores[0], err)
	}
}
