package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natsauth"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// chartBrokerPerms are the broker user's permissions of the NATS Helm
// values (deploy/helm/nats-values.yaml): it may create, update and read
// the jobs stream and the directed queues' stream, not delete them.
const chartBrokerPerms = `{
  publish: { allow: ["sy.jobs.>", "sy.cancel.*", "sy.learn.*.*.*",
    "$JS.API.STREAM.CREATE.SWITCHYARD_JOBS", "$JS.API.STREAM.UPDATE.SWITCHYARD_JOBS",
    "$JS.API.STREAM.INFO.SWITCHYARD_JOBS", "$JS.API.CONSUMER.INFO.SWITCHYARD_JOBS.*",
    "$JS.API.STREAM.MSG.DELETE.SWITCHYARD_JOBS", "sy.to.>",
    "$JS.API.STREAM.CREATE.SWITCHYARD_JOBS_DIRECTED", "$JS.API.STREAM.UPDATE.SWITCHYARD_JOBS_DIRECTED",
    "$JS.API.STREAM.INFO.SWITCHYARD_JOBS_DIRECTED", "$JS.API.STREAM.MSG.DELETE.SWITCHYARD_JOBS_DIRECTED"] }
  subscribe: { allow: ["sy.hb.>", "sy.learn.>", "sy.kv.>", "sy.reply.*.*", "_INBOX.broker.>"] }
}`

// startChartNATS runs a nats-server configured as the NATS chart's is:
// JetStream with a file store and max_memory_store as given ("0" in the
// chart), an account with the chart's broker user, a reader with the
// broker's permissions but those to create and update the stream, and an
// admin user (the
// agents', the test's and the operator's recipes', also for clients
// without credentials), and returns its URL.
func startChartNATS(t *testing.T, maxMemory string) string {
	t.Helper()
	dir := t.TempDir()
	conf := fmt.Sprintf(`listen: "127.0.0.1:-1"
max_payload: 8388608
jetstream { store_dir: %q, max_memory_store: %s, max_file_store: 1G }
accounts {
  SWITCHYARD {
    jetstream: enabled
    users: [
      { user: broker, password: bpw, permissions: %s }
      { user: admin, password: apw }
      { user: reader, password: rpw, permissions: %s }
    ]
  }
}
no_auth_user: admin
`, dir, maxMemory, chartBrokerPerms, strings.NewReplacer(`"$JS.API.STREAM.CREATE.SWITCHYARD_JOBS", "$JS.API.STREAM.UPDATE.SWITCHYARD_JOBS",`, "", "_INBOX.broker.>", "_INBOX.reader.>").Replace(chartBrokerPerms))
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := natsauth.ServerOptions(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	return natstest.RunServer(t, opts).ClientURL()
}

// adminJS connects as the chart NATS's admin user.
func adminJS(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo("admin", "apw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// readyz returns the status and body of a broker's /readyz.
func readyz(base string) (int, string, error) {
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// waitReadyz waits until a broker's /readyz answers status with a body
// holding every one of want.
func waitReadyz(t *testing.T, base string, status int, want ...string) string {
	t.Helper()
	var body string
	testwait.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		code, b, err := readyz(base)
		if err != nil {
			return err
		}
		body = b
		if code != status {
			return fmt.Errorf("/readyz %d %s, want %d", code, b, status)
		}
		for _, w := range want {
			if !strings.Contains(b, w) {
				return fmt.Errorf("/readyz %d %s, want %q in it", code, b, w)
			}
		}
		return nil
	})
	return body
}

// TestJobsStorageOnChartNATS runs the broker against a NATS configured as
// the NATS Helm chart's (JetStream on disk only, max_memory_store 0) with
// the chart's broker user, which may not delete the stream.
func TestJobsStorageOnChartNATS(t *testing.T) {
	brokerUser := []string{"--nats-user", "broker", "--nats-password", "bpw"}

	// The default storage fits: the fleet serves.
	t.Run("default serves", func(t *testing.T) {
		url := startChartNATS(t, "0")
		b := cmdtest.StartBroker(t, append(brokerUser, "--nats-url", url)...)
		e := fastEngine(t, 2)
		startAgent(t, url, "a1", e, 2)
		cmdtest.WaitEligible(t, b.HTTP, "a1")
		for i := range 3 {
			if r, err := rawStream(context.Background(), b.HTTP, fmt.Sprintf("on disk %d", i), 4); err != nil || !r.done || r.status != http.StatusOK {
				t.Fatalf("request %d: %+v %v", i, r, err)
			}
		}
		st, err := adminJS(t, url).Stream(context.Background(), "SWITCHYARD_JOBS")
		if err != nil || st.CachedInfo().Config.Storage != jetstream.FileStorage {
			t.Fatalf("stream %v, want file storage", err)
		}
	})

	// Memory the server does not have: the broker says so on /readyz and
	// in its log, with JetStream's words and code, and never says ready.
	t.Run("memory refused", func(t *testing.T) {
		url := startChartNATS(t, "0")
		p := cmdtest.Start(t, brokerRun, append(brokerUser, "--nats-url", url, "--jobs-storage", "memory",
			"--http", "127.0.0.1:0", "--grpc", "", "--heartbeat-interval", "100ms", "--log-level", "info")...)
		base, _, _ := cmdtest.WaitListening(t, p.Out, p.Exited)
		body := waitReadyz(t, base, http.StatusServiceUnavailable, "jobs stream unusable: SWITCHYARD_JOBS", "insufficient memory resources available (JetStream error 10028)")
		testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
			if !strings.Contains(p.Err.String(), "jobs stream cannot take jobs") || !strings.Contains(p.Err.String(), "10028") {
				return fmt.Errorf("the log does not name the cause:\n%s", p.Err.String())
			}
			return nil
		})
		if strings.Contains(p.Err.String(), "broker ready") {
			t.Fatalf("the broker logged ready while NATS refuses its stream:\n%s", p.Err.String())
		}
		t.Logf("/readyz: %s", body)
	})

	// A user that may not create the stream: the broker says which
	// permission the server denied.
	t.Run("permission denied", func(t *testing.T) {
		url := startChartNATS(t, "0")
		p := cmdtest.Start(t, brokerRun, "--nats-user", "reader", "--nats-password", "rpw", "--nats-url", url,
			"--http", "127.0.0.1:0", "--grpc", "", "--heartbeat-interval", "100ms", "--log-level", "info")
		base, _, _ := cmdtest.WaitListening(t, p.Out, p.Exited)
		waitReadyz(t, base, http.StatusServiceUnavailable, "jobs stream unusable: SWITCHYARD_JOBS", "cannot create it", "permission denied", "$JS.API.STREAM.")
		if strings.Contains(p.Err.String(), "broker ready") {
			t.Fatalf("the broker logged ready without its stream:\n%s", p.Err.String())
		}
	})

	// A memory stream from before (created when memory was the default)
	// on a server whose memory is full: the broker keeps the stream it
	// finds, and says that the servers refuse its writes. The operator
	// deletes the stream as docs/operations.md says (the broker's user may
	// not); the broker makes it again with its own storage and is ready,
	// without a restart.
	t.Run("memory stream replaced in place", func(t *testing.T) {
		url := startChartNATS(t, "1")
		admin := adminJS(t, url)
		ctx := context.Background()
		if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "SWITCHYARD_JOBS", Subjects: []string{"sy.jobs.>"},
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage}); err != nil {
			t.Fatal(err)
		}
		// What the memory holds already fills it.
		if _, err := admin.Publish(ctx, "sy.jobs.earlier", []byte("a job of before")); err != nil {
			t.Fatal(err)
		}
		p := cmdtest.Start(t, brokerRun, append(brokerUser, "--nats-url", url,
			"--http", "127.0.0.1:0", "--grpc", "", "--heartbeat-interval", "100ms", "--log-level", "info")...)
		base, _, _ := cmdtest.WaitListening(t, p.Out, p.Exited)
		waitReadyz(t, base, http.StatusServiceUnavailable, "jobs stream unusable: SWITCHYARD_JOBS (Memory", "refuse to store jobs", "insufficient resources (JetStream error 10023)")
		if !strings.Contains(p.Err.String(), "keeps the storage it was created with") {
			t.Fatalf("no warning about the kept storage:\n%s", p.Err.String())
		}

		// The broker's own user cannot delete the stream.
		bnc, err := nats.Connect(url, nats.UserInfo("broker", "bpw"), nats.CustomInboxPrefix("_INBOX.broker"))
		if err != nil {
			t.Fatal(err)
		}
		defer bnc.Close()
		bjs, _ := jetstream.New(bnc)
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		err = bjs.DeleteStream(dctx, "SWITCHYARD_JOBS")
		cancel()
		if err == nil {
			t.Fatal("the broker's user deleted the stream: the test shows nothing")
		}

		if err := admin.DeleteStream(ctx, "SWITCHYARD_JOBS"); err != nil {
			t.Fatal(err)
		}
		waitReadyz(t, base, http.StatusOK)
		testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
			if !strings.Contains(p.Err.String(), "jobs stream takes jobs again") {
				return fmt.Errorf("no recovery in the log:\n%s", p.Err.String())
			}
			return nil
		})
		st, err := admin.Stream(ctx, "SWITCHYARD_JOBS")
		if err != nil || st.CachedInfo().Config.Storage != jetstream.FileStorage {
			t.Fatalf("stream %v, want it made again on disk", err)
		}
		e := fastEngine(t, 2)
		startAgent(t, url, "a1", e, 2)
		cmdtest.WaitEligible(t, base, "a1")
		if r, err := rawStream(ctx, base, "after the change", 4); err != nil || !r.done || r.status != http.StatusOK {
			t.Fatalf("request after the change: %+v %v", r, err)
		}
	})
}

// TestJobsStreamWithoutQuorum: on a 3-node cluster that gives JetStream
// (almost) no memory, a memory stream of 3 replicas is created, takes a
// message, refuses the next and loses its leader, as on the NATS chart
// with the memory storage. The broker says so on /readyz once the stream
// has gone without a leader for --publish-wait, and an agent that cannot
// make its consumer logs why, not only that its try timed out.
func TestJobsStreamWithoutQuorum(t *testing.T) {
	c := natstest.RunClusterWith(t, "noquorum", 3, func(o *server.Options) { o.JetStreamMaxMemory = 1 })
	urls := c.URLs(0)
	p := cmdtest.Start(t, brokerRun, "--nats-url", urls, "--replicas", "3", "--jobs-storage", "memory", "--publish-wait", "2s",
		"--http", "127.0.0.1:0", "--grpc", "", "--heartbeat-interval", "100ms", "--log-level", "info")
	base, _, _ := cmdtest.WaitListening(t, p.Out, p.Exited)

	// Jobs fill what memory there is: the stream refuses one and loses
	// its leader.
	nc, err := nats.Connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		if _, err := js.Stream(context.Background(), "SWITCHYARD_JOBS"); err != nil {
			return err
		}
		return nil
	})
	var refused error
	for i := 0; i < 5 && refused == nil; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, refused = js.Publish(ctx, "sy.jobs.filler", []byte("a job"))
		cancel()
	}
	if refused == nil {
		t.Fatal("the memory stream took every job: the test shows nothing")
	}
	body := waitReadyz(t, base, http.StatusServiceUnavailable, "jobs stream unusable: SWITCHYARD_JOBS (Memory storage, replicas 3)", "no leader")
	t.Logf("/readyz: %s", body)
	// The stream is checked every second: the log follows within one.
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if out := p.Err.String(); !strings.Contains(out, "jobs stream cannot take jobs") || !strings.Contains(out, "no leader") {
			return fmt.Errorf("the broker's log does not name the cause:\n%s", out)
		}
		return nil
	})

	a := cmdtest.Start(t, agentRun, "--nats-url", urls, "--engine", "sim", "--id", "a1", "--heartbeat", "100ms", "--log-level", "warn")
	testwait.For(t, 60*time.Second, 50*time.Millisecond, func() error {
		out := a.Err.String()
		if !strings.Contains(out, "jobs consumer not ready") {
			return fmt.Errorf("no consumer failure logged yet:\n%s", out)
		}
		if !strings.Contains(out, "has no leader") && !strings.Contains(out, "does not answer about the consumer either") {
			t.Fatalf("the agent's log does not say why its consumer is not ready:\n%s", out)
		}
		return nil
	})
	t.Logf("agent: %s", cmdtest.Tail(a.Err.String(), 600))
}
