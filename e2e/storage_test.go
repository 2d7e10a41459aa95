//go:build unix

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func jobsStorage(t *testing.T, natsURL string) jetstream.StorageType {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "SWITCHYARD_JOBS")
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().Config.Storage
}

// TestJobsStorage: the jobs stream is in memory unless --jobs-storage file
// asks for disk; a stream created with the other storage keeps it (with a
// warning) and the broker serves on it.
func TestJobsStorage(t *testing.T) {
	t.Run("default memory", func(t *testing.T) {
		b := startBroker(t)
		if got := jobsStorage(t, b.NATS); got != jetstream.MemoryStorage {
			t.Fatalf("storage %v, want memory", got)
		}
	})
	t.Run("file", func(t *testing.T) {
		b := startBroker(t, "--jobs-storage", "file")
		if got := jobsStorage(t, b.NATS); got != jetstream.FileStorage {
			t.Fatalf("storage %v, want file", got)
		}
	})
	t.Run("existing stream keeps its storage", func(t *testing.T) {
		ns := startNATSProcess(t, t.TempDir())
		first := startBroker(t, "--nats-url", ns.URL(), "--jobs-storage", "file")
		if err := first.Stop(t); err != nil {
			t.Fatal(err)
		}
		b := startBroker(t, "--nats-url", ns.URL())
		e := fastEngine(t, 2)
		startAgent(t, ns.URL(), "a1", e, 2)
		waitEligible(t, b.HTTP, "a1")
		if r, err := rawStream(context.Background(), b.HTTP, "still served", 4); err != nil || !r.done {
			t.Fatalf("request on the kept stream: %+v %v", r, err)
		}
		if got := jobsStorage(t, ns.URL()); got != jetstream.FileStorage {
			t.Fatalf("storage %v, want the file storage it was created with", got)
		}
		if !strings.Contains(b.errs.String(), "keeps the storage it was created with") {
			t.Fatalf("no warning in the broker's log:\n%s", b.errs.String())
		}
	})
	t.Run("bad value", func(t *testing.T) {
		err := brokerRun(context.Background(), []string{"--jobs-storage", "disk"}, noEnv, &syncBuffer{}, &syncBuffer{})
		if err == nil || !strings.Contains(err.Error(), "want memory or file") {
			t.Fatalf("err %v", err)
		}
	})
}
