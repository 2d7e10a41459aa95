package natsauth_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// natscliVersion is the NATS CLI the recipes of docs/operations.md name.
const natscliVersion = "v0.5.0"

const (
	shippedConfig = "../../deploy/nats/server.conf"
	operationsDoc = "../../docs/operations.md"
	// docAddress is the server address the recipes are written for; the
	// test's server listens on a random port instead.
	docAddress = "nats://127.0.0.1:4222"
)

// passwords are the test values of the environment variables server.conf
// reads.
var passwords = map[string]string{
	"SY_NATS_BROKER_PASSWORD":        "test-broker-change-me",
	"SY_NATS_AGENT_REGULAR_PASSWORD": "test-regular-change-me",
	"SY_NATS_AGENT_PREFILL_PASSWORD": "test-prefill-change-me",
	"SY_NATS_AGENT_DECODE_PASSWORD":  "test-decode-change-me",
	"SY_NATS_OBSERVER_PASSWORD":      "test-observer-change-me",
	"SY_NATS_SYS_PASSWORD":           "test-sys-change-me",
}

// natsCLI returns the NATS CLI binary of natscliVersion, built once from
// the Go module proxy into the user's cache, outside this module.
func natsCLI(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no user cache directory for the NATS CLI: %v", err)
	}
	dir := filepath.Join(cache, "switchyard", "natscli-"+natscliVersion)
	bin := filepath.Join(dir, "nats")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build the NATS CLI: %v", err)
	}
	cmd := exec.Command(goBin, "install", "github.com/nats-io/natscli/nats@"+natscliVersion)
	cmd.Dir = t.TempDir() // no go.mod: the CLI's own module graph
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOBIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the NATS CLI %s: %v\n%s", natscliVersion, err, out)
	}
	return bin
}

// recipe is one line of a shell block of the doc's "NATS recipes"
// section that runs the CLI.
type recipe struct {
	line    string // as written
	command string // without its comment
}

// docRecipes reads the recipes from the "## NATS recipes" section of the
// operations guide: every line starting with "nats " in its sh blocks.
func docRecipes(t *testing.T) []recipe {
	t.Helper()
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, section, ok := strings.Cut(string(doc), "\n## NATS recipes\n")
	if !ok {
		t.Fatalf("%s: no \"## NATS recipes\" section", operationsDoc)
	}
	after := ""
	if i := strings.Index(section, "\n## "); i >= 0 {
		section, after = section[:i], section[i:]
	}
	// A recipe elsewhere in the guide would escape this test.
	for _, part := range []string{before, after} {
		if n := len(cliLines(part)); n > 0 {
			t.Errorf("%s: %d nats command(s) outside the NATS recipes section: move them there", operationsDoc, n)
		}
	}
	var out []recipe
	for _, line := range cliLines(section) {
		cmd, _, _ := strings.Cut(line, " #")
		out = append(out, recipe{line: line, command: strings.TrimSpace(cmd)})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no nats command in the NATS recipes section", operationsDoc)
	}
	return out
}

// cliLines returns the lines of md's sh blocks that run the NATS CLI.
func cliLines(md string) []string {
	var out []string
	inBlock := false
	for _, line := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inBlock = true
		case strings.HasPrefix(line, "```"):
			inBlock = false
		case inBlock && strings.HasPrefix(line, "nats "):
			out = append(out, line)
		}
	}
	return out
}

// recipeCheck is what a recipe must print; trigger, when set, makes the
// event a waiting recipe (a subscription) is for, once it listens.
type recipeCheck struct {
	want    []*regexp.Regexp
	trigger func(t *testing.T, f *fixture)
}

func wants(res ...string) []*regexp.Regexp {
	out := make([]*regexp.Regexp, len(res))
	for i, re := range res {
		out[i] = regexp.MustCompile(re)
	}
	return out
}

// recipeChecks says, for every recipe of the doc, what its output shows;
// a recipe the doc gains without a check here fails the test.
var recipeChecks = map[string]recipeCheck{
	`nats context save sy --server nats://127.0.0.1:4222 --user observer --password "$SY_NATS_OBSERVER_PASSWORD" --inbox-prefix _INBOX.observer --select`: {
		want: wants(`NATS Configuration Context "sy"`, `observer`),
	},
	`nats context save sy-sys --server nats://127.0.0.1:4222 --user sys --password "$SY_NATS_SYS_PASSWORD" --inbox-prefix _INBOX.sys`: {
		want: wants(`NATS Configuration Context "sy-sys"`),
	},
	`nats sub 'sy.hb.>' --count 3`: {
		want: wants(`\[#3\] Received on "sy\.hb\.sim-model\.regular\.a1"`, `"agent_id":"a1"`),
	},
	`nats sub 'sy.cancel.>' --count 1`: {
		want:    wants(`\[#1\] Received on "sy\.cancel\.`),
		trigger: func(t *testing.T, f *fixture) { f.cancelQueued(t) },
	},
	`nats stream info SWITCHYARD_JOBS`: {
		want: wants(`Information for Stream SWITCHYARD_JOBS`, `Retention: WorkQueue`, `Messages: [12]\b`),
	},
	`nats stream subjects SWITCHYARD_JOBS`: {
		want: wants(`sy\.jobs\.sim-model\.regular`),
	},
	`nats consumer ls SWITCHYARD_JOBS`: {
		want: wants(`jobs-sim-model-regular\b`),
	},
	`nats consumer ls SWITCHYARD_JOBS_DIRECTED`: {
		want: wants(`jobs-sim-model-regular-to-[0-9a-f]{16}`),
	},
	`nats consumer info SWITCHYARD_JOBS jobs-sim-model-regular`: {
		want: wants(`Information for Consumer SWITCHYARD_JOBS > jobs-sim-model-regular`, `Filter Subject: sy\.jobs\.sim-model\.regular`, `Waiting Pulls`, `Unprocessed Messages`, `Outstanding Acks`),
	},
	`nats --context sy-sys server ls`: {
		want: wants(`switchyard-recipes`),
	},
	`nats --context sy-sys server report jetstream`: {
		want: wants(`switchyard-recipes`, `JetStream Summary|Streams`),
	},
}

// TestOperationsRecipes runs the NATS CLI recipes of docs/operations.md,
// read from the doc, on a server of the shipped configuration with a
// broker and an agent, each as written apart from the server's address.
// The fleet is set up so that each has something to show: an agent with
// one slot busy on a long stream, and two jobs queued behind it (one of
// which the cancel recipe sees cancelled).
func TestOperationsRecipes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the NATS CLI and runs a fleet")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run the recipes as written")
	}
	recipes := docRecipes(t)
	for _, r := range recipes {
		if _, ok := recipeChecks[r.command]; !ok {
			t.Fatalf("recipe %q of %s has no check in recipeChecks: say what it must print", r.command, operationsDoc)
		}
	}
	cli := natsCLI(t)
	f := startFixture(t)

	home := t.TempDir()
	env := []string{
		"PATH=" + filepath.Dir(cli) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
	}
	for k, v := range passwords {
		env = append(env, k+"="+v)
	}
	for _, r := range recipes {
		t.Run(r.command, func(t *testing.T) {
			check := recipeChecks[r.command]
			line := strings.ReplaceAll(r.line, docAddress, f.natsURL)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "sh", "-c", line)
			cmd.Env = env
			var out testwait.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if check.trigger != nil {
				f.waitSubscribed(t, "sy.cancel.>")
				check.trigger(t, f)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("%s: %v\n%s", r.line, err, out.String())
			}
			t.Logf("$ %s\n%s", line, out.String())
			for _, re := range check.want {
				if !re.MatchString(out.String()) {
					t.Errorf("%s: output lacks %q:\n%s", r.line, re, out.String())
				}
			}
			if strings.HasPrefix(r.command, "nats sub 'sy.hb.>'") {
				checkHeartbeats(t, out.String())
			}
			if t.Failed() {
				t.Logf("the broker's and agent's logs:\n%s", f.logs.String())
			}
		})
	}
}

// checkHeartbeats parses every heartbeat a subscription printed as the
// broker does.
func checkHeartbeats(t *testing.T, out string) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		hb, err := wire.UnmarshalHeartbeat([]byte(line))
		if err != nil {
			t.Errorf("heartbeat %s: %v", line, err)
			continue
		}
		if hb.GetAgentId() != "a1" || hb.GetModel() != "sim-model" {
			t.Errorf("heartbeat of %q/%q, want a1/sim-model", hb.GetAgentId(), hb.GetModel())
		}
		n++
	}
	if n != 3 {
		t.Errorf("%d heartbeats printed, want 3:\n%s", n, out)
	}
}

// fixture is a server of the shipped configuration with a broker, an agent
// of one slot busy on a long stream, and two jobs queued.
type fixture struct {
	srv      *server.Server
	natsURL  string
	httpURL  string
	requests []context.CancelFunc // the stream's, then the queued ones'
	logs     *testwait.Buffer     // the broker's and the agent's logs
}

func startFixture(t *testing.T) *fixture {
	t.Helper()
	for k, v := range passwords {
		t.Setenv(k, v) // nats-server reads them from the environment
	}
	opts, err := server.ProcessConfigFile(shippedConfig)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Host != "127.0.0.1" || opts.StoreDir == "" || strings.HasPrefix(opts.StoreDir, os.TempDir()) {
		t.Errorf("shipped config: listen %s, store_dir %q; want loopback and a store outside %s", opts.Host, opts.StoreDir, os.TempDir())
	}
	if opts.SystemAccount != "SYS" {
		t.Errorf("shipped config: system_account %q, want SYS", opts.SystemAccount)
	}
	opts.Port = -1
	opts.StoreDir = t.TempDir()
	opts.ServerName = "switchyard-recipes"
	opts.NoSigs = true
	opts.NoLog = true
	f := &fixture{srv: natstest.RunServer(t, opts), logs: &testwait.Buffer{}}
	f.natsURL = f.srv.ClientURL()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		for _, c := range f.requests {
			c()
		}
		cancel()
		wg.Wait()
	})
	run := func(name string, fn func(context.Context, []string, func(string) string, io.Writer, io.Writer) error, password string, stdout io.Writer, args ...string) {
		getenv := func(k string) string {
			if k == "SWITCHYARD_NATS_PASSWORD" {
				return password
			}
			return ""
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, args, getenv, stdout, f.logs); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	brokerOut := &testwait.Buffer{}
	run("broker", brokercmd.Run, passwords["SY_NATS_BROKER_PASSWORD"], brokerOut,
		"--nats-url", f.natsURL, "--nats-user", "broker-1", "--id", "broker-1",
		"--http", "127.0.0.1:0", "--grpc", "", "--heartbeat-interval", "500ms", "--slow-start", "0", "--log-level", "warn")
	run("agent", agentcmd.Run, passwords["SY_NATS_AGENT_REGULAR_PASSWORD"], io.Discard,
		"--nats-url", f.natsURL, "--nats-user", "agent-regular", "--id", "a1",
		"--engine", "sim", "--model", "sim-model", "--slots", "1", "--slow-start", "0",
		"--sim-ttft", "1ms", "--sim-itl", "1s", "--heartbeat", "500ms", "--log-level", "warn")

	listening := regexp.MustCompile(`http=(\S+) nats=`)
	testwait.For(t, 60*time.Second, 20*time.Millisecond, func() error {
		m := listening.FindStringSubmatch(brokerOut.String())
		if m == nil {
			return fmt.Errorf("broker not listening yet; logs:\n%s", f.logs.String())
		}
		f.httpURL = m[1]
		return nil
	})
	testwait.Status(t, nil, f.httpURL+"/readyz", http.StatusOK)

	// One stream holds the agent's only slot for the test's length (a
	// token a second), so the next jobs wait in the queue.
	testwait.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		return f.startStream(1000)
	})
	js := f.observer(t)
	for range 2 {
		rctx, rcancel := context.WithCancel(context.Background())
		f.requests = append(f.requests, rcancel)
		go func() {
			resp, err := http.DefaultClient.Do(chatRequest(rctx, f.httpURL, 4))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	testwait.For(t, 30*time.Second, 20*time.Millisecond, func() error {
		st, err := js.Stream(context.Background(), "SWITCHYARD_JOBS")
		if err != nil {
			return err
		}
		if n := st.CachedInfo().State.Msgs; n != 2 {
			return fmt.Errorf("%d jobs queued, want 2", n)
		}
		return nil
	})
	return f
}

func chatRequest(ctx context.Context, base string, maxTokens int) *http.Request {
	body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":%d,"stream":true}`, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

// startStream starts a streaming request and returns once its first token
// came; the stream goes on in the background until the test ends.
func (f *fixture) startStream(maxTokens int) error {
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := http.DefaultClient.Do(chatRequest(ctx, f.httpURL, maxTokens))
	if err != nil {
		cancel()
		return err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		return fmt.Errorf("stream: %s %s", resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"content"`) {
			f.requests = append(f.requests, cancel)
			go func() { _, _ = io.Copy(io.Discard, resp.Body); resp.Body.Close() }()
			return nil
		}
	}
	resp.Body.Close()
	cancel()
	return fmt.Errorf("stream ended before its first token: %v", sc.Err())
}

// cancelQueued leaves one of the queued requests, which makes the broker
// cancel it.
func (f *fixture) cancelQueued(t *testing.T) {
	t.Helper()
	f.requests[len(f.requests)-1]()
}

// observer connects as the read-only user, as the recipes do.
func (f *fixture) observer(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(f.natsURL, nats.UserInfo("observer", passwords["SY_NATS_OBSERVER_PASSWORD"]), nats.CustomInboxPrefix("_INBOX.observer"))
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

// waitSubscribed waits for a subscription to exactly subject in the
// Switchyard account: the CLI says it subscribes before its SUB reaches
// the server.
func (f *fixture) waitSubscribed(t *testing.T, subject string) {
	t.Helper()
	testwait.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		sz, err := f.srv.Subsz(&server.SubszOptions{Account: "SWITCHYARD", Subscriptions: true, Limit: 4096})
		if err != nil {
			return err
		}
		for _, sub := range sz.Subs {
			if sub.Subject == subject {
				return nil
			}
		}
		return fmt.Errorf("no subscription to %s yet", subject)
	})
}
