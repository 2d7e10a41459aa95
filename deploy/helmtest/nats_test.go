package helmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// officialNATSChartVersion is the NATS chart nats-values.yaml is written
// and tested for.
const officialNATSChartVersion = "2.14.2"

// officialNATSChart is the official NATS chart's package, read as test
// data from the charts folder beside the repository; the tests that need
// it skip without it.
func officialNATSChart(t *testing.T) string {
	t.Helper()
	p := filepath.Join(cmdtest.RepoRoot(t), "..", "shared", "charts", "nats-"+officialNATSChartVersion+".tgz")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("the official NATS chart %s is not at %s: %v", officialNATSChartVersion, p, err)
	}
	return p
}

// natsUsers are the users of nats-values.yaml, each with the Secret key
// of its password and the variable of its hash.
var natsUsers = []string{"broker", "agent-regular", "agent-prefill", "agent-decode", "observer", "sys", "probe"}

// bcryptHash is a password as nats-server takes a bcrypt hash.
var bcryptHash = regexp.MustCompile(`^\$2[abxy]\$\d{2}\$`)

// natsAuthSecret is the Secret of the servers' hashes file, key
// passwords.conf (hashesFile), that nats-values.yaml mounts.
const natsAuthSecret = "switchyard-nats-auth"

func hashVar(user string) string {
	return "SY_NATS_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_HASH"
}

// natsInstall is the NATS chart rendered with nats-values.yaml, its
// configuration written out as a server would find it: nats.conf in
// etc/nats-config and the hashes file of Secret switchyard-nats-auth in
// etc/nats-auth, whose passwords are those podEnv stands in for the
// Secret switchyard-nats (secret-<user>).
type natsInstall struct {
	objs      []object
	conf      string // path of nats.conf
	passwords string // path of passwords.conf
}

func renderNATS(t *testing.T) natsInstall {
	t.Helper()
	values := filepath.Join(cmdtest.RepoRoot(t), "deploy", "helm", "nats-values.yaml")
	out, err := helm(t, "template", "nats", officialNATSChart(t), "-f", values, "--namespace", "sy", "--kube-version", kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	in := natsInstall{objs: decodeAll(t, out)}
	var conf string
	for _, o := range in.objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok && cm.Data["nats.conf"] != "" {
			conf = cm.Data["nats.conf"]
		}
	}
	if conf == "" {
		t.Fatal("the NATS chart rendered no nats.conf")
	}
	root := t.TempDir()
	in.conf = filepath.Join(root, "etc", "nats-config", "nats.conf")
	in.passwords = filepath.Join(root, "etc", "nats-auth", "passwords.conf")
	for _, d := range []string{filepath.Dir(in.conf), filepath.Dir(in.passwords)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(in.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	in.writePasswords(t, nil)
	// The chart names each server after its pod.
	t.Setenv("SERVER_NAME", "nats-0")
	return in
}

// writePasswords writes the hashes file as docs/kubernetes.md has it made:
// one bcrypt hash per user of its password, secret-<user> unless over says
// otherwise.
func (in natsInstall) writePasswords(t *testing.T, over map[string]string) {
	t.Helper()
	pw := map[string]string{}
	for _, u := range natsUsers {
		pw[u] = "secret-" + u
		if p, ok := over[u]; ok {
			pw[u] = p
		}
	}
	if err := os.WriteFile(in.passwords, []byte(hashesFile(t, pw)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// hashesFile is the key passwords.conf of Secret switchyard-nats-auth for
// the plain passwords of Secret switchyard-nats (user -> password): one
// line SY_NATS_<USER>_HASH: "<bcrypt hash>" per user of natsUsers, and no
// other, since nats-server refuses a variable that nats.conf does not use.
// A user without a password is a test's mistake.
func hashesFile(t testing.TB, passwords map[string]string) string {
	t.Helper()
	var b strings.Builder
	for _, u := range natsUsers {
		pw, ok := passwords[u]
		if !ok {
			t.Fatalf("no password for NATS user %s", u)
		}
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %q\n", hashVar(u), h)
	}
	return b.String()
}

// TestNATSValues renders the official NATS chart with nats-values.yaml,
// loads the nats.conf it writes, with a hashes file, into nats-server,
// and compares its users and permissions with deploy/nats/server.conf's:
// the same accounts, the agents' and the observer's permissions unchanged,
// the broker's in the form for a group of brokers sharing one user, the
// system user's, and the probe alone in an account of its own. Every
// password on the server is a bcrypt hash.
func TestNATSValues(t *testing.T) {
	in := renderNATS(t)
	got, err := server.ProcessConfigFile(in.conf)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered nats.conf: %v", err)
	}
	if got.MaxPayload < brokercmd.DefaultMaxPayload {
		t.Errorf("max_payload %d is below the broker's %d", got.MaxPayload, brokercmd.DefaultMaxPayload)
	}
	if len(got.Routes) != 3 || !got.JetStream || got.StoreDir == "" || got.HTTPPort == 0 {
		t.Errorf("routes %v, jetstream %v in %q, monitoring %d: want a 3-node JetStream cluster on volumes, monitored", got.Routes, got.JetStream, got.StoreDir, got.HTTPPort)
	}
	if want := defaults.jobsReplicas; want != fmt.Sprint(len(got.Routes)) {
		t.Errorf("the chart's jobs stream replicas %s differ from the cluster's %d nodes", want, len(got.Routes))
	}
	// values.yaml's claim: clients learn no node addresses, and reconnect
	// through the Service.
	if !got.Cluster.NoAdvertise {
		t.Error("no_advertise is off: values.yaml says clients learn no node address")
	}
	if got.SystemAccount != "SYS" {
		t.Errorf("system_account %q, want SYS", got.SystemAccount)
	}
	if got.NoAuthUser != "" {
		t.Errorf("no_auth_user %q: a client without credentials must be refused", got.NoAuthUser)
	}

	// The project's configuration, with its passwords.
	root := cmdtest.RepoRoot(t)
	refPath := filepath.Join(root, "deploy", "nats", "server.conf")
	refText, err := os.ReadFile(refPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$(SY_NATS_[A-Z_]+_PASSWORD)`).FindAllStringSubmatch(string(refText), -1) {
		t.Setenv(m[1], "x")
	}
	ref, err := server.ProcessConfigFile(refPath)
	if err != nil {
		t.Fatal(err)
	}
	refUsers := map[string]*server.User{}
	for _, u := range ref.Users {
		refUsers[u.Username] = u
	}
	// The broker group's user: broker-1's permissions with its id made a
	// wildcard (deploy/nats/README.md, "More brokers").
	if b, ok := refUsers["broker-1"]; ok {
		group := map[string]string{
			"sy.reply.broker-1.*":   "sy.reply.*.*",
			"_INBOX.broker-1.>":     "_INBOX.broker.>",
			"sy.learn.*.*.broker-1": "sy.learn.*.*.*",
		}
		sub := func(l []string) []string {
			out := slices.Clone(l)
			for i, s := range out {
				if r, ok := group[s]; ok {
					out[i] = r
				}
			}
			return out
		}
		refUsers["broker"] = &server.User{Username: "broker", Account: b.Account, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: sub(b.Permissions.Publish.Allow)},
			Subscribe: &server.SubjectPermission{Allow: sub(b.Permissions.Subscribe.Allow)},
		}}
		delete(refUsers, "broker-1")
	} else {
		t.Fatal("deploy/nats/server.conf has no broker-1")
	}

	seen := map[string]bool{}
	for _, u := range got.Users {
		seen[u.Username] = true
		if !bcryptHash.MatchString(u.Password) {
			t.Errorf("user %s: the server holds its password in clear, not as a bcrypt hash", u.Username)
		} else if bcrypt.CompareHashAndPassword([]byte(u.Password), []byte("secret-"+u.Username)) != nil {
			t.Errorf("user %s: the hash is not %s's from the hashes file", u.Username, hashVar(u.Username))
		}
		if u.Username == "probe" {
			if u.Account == nil || u.Account.Name != "PROBE" || u.Permissions != nil {
				t.Errorf("user probe: account %v, permissions %+v: want an account of its own", u.Account, u.Permissions)
			}
			continue
		}
		r, ok := refUsers[u.Username]
		if !ok {
			t.Errorf("user %s is not one of deploy/nats's", u.Username)
			continue
		}
		if u.Account == nil || r.Account == nil || u.Account.Name != r.Account.Name {
			t.Errorf("user %s: account %v, want %v", u.Username, u.Account, r.Account)
		}
		for _, dir := range []struct {
			name      string
			got, want *server.SubjectPermission
		}{
			{"publish", u.Permissions.Publish, r.Permissions.Publish},
			{"subscribe", u.Permissions.Subscribe, r.Permissions.Subscribe},
		} {
			g, w := slices.Sorted(slices.Values(dir.got.Allow)), slices.Sorted(slices.Values(dir.want.Allow))
			if !slices.Equal(g, w) || len(dir.got.Deny) != len(dir.want.Deny) {
				t.Errorf("user %s %s: allow %q, want %q", u.Username, dir.name, g, w)
			}
		}
	}
	for name := range refUsers {
		if !seen[name] {
			t.Errorf("user %s of deploy/nats is missing", name)
		}
	}
	// The Switchyard chart's default NATS users are these.
	for _, u := range []string{"broker", "agent-regular", "agent-prefill", "agent-decode"} {
		if !seen[u] {
			t.Errorf("the chart's NATS user %s is not in nats-values.yaml", u)
		}
	}

	checkNATSPods(t, in.objs, got)
}

// checkNATSPods: the hashes file is mounted into the server and its
// reloader, which watches it; nats-box and the `helm test` pod have
// contexts whose passwords come from Secret switchyard-nats.
func checkNATSPods(t *testing.T, objs []object, opts *server.Options) {
	t.Helper()
	var sts *appsv1.StatefulSet
	var box *appsv1.Deployment
	var test *corev1.Pod
	contexts := map[string]map[string]string{}
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *appsv1.StatefulSet:
			sts = v
		case *appsv1.Deployment:
			box = v
		case *corev1.Pod:
			test = v
		case *corev1.Secret:
			for k, d := range v.StringData {
				name, ok := strings.CutSuffix(k, ".json")
				if !ok {
					continue
				}
				var c map[string]string
				if err := json.Unmarshal([]byte(d), &c); err != nil {
					t.Errorf("context %s: %v", k, err)
				}
				contexts[name] = c
			}
		}
	}
	if sts == nil || box == nil || test == nil {
		t.Fatalf("StatefulSet %v, nats-box %v, test pod %v: want all three", sts != nil, box != nil, test != nil)
	}
	authVolume := ""
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == natsAuthSecret {
			authVolume = v.Name
		}
	}
	if authVolume == "" {
		t.Error("the servers mount no volume of Secret switchyard-nats-auth")
	}
	for _, c := range sts.Spec.Template.Spec.Containers {
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == authVolume && m.MountPath == "/etc/nats-auth"
		})
		if !mounted {
			t.Errorf("container %s does not mount the hashes at /etc/nats-auth", c.Name)
		}
		if c.Name == "reloader" && !slices.Contains(c.Args, "/etc/nats-auth/passwords.conf") {
			t.Errorf("the reloader does not watch the hashes file: %q", c.Args)
		}
	}

	users := map[string]bool{}
	for _, u := range opts.Users {
		users[u.Username] = true
	}
	for name, spec := range map[string]corev1.PodSpec{"nats-box": box.Spec.Template.Spec, "helm test": test.Spec} {
		env := map[string]corev1.EnvVar{}
		for _, c := range spec.Containers {
			for _, e := range c.Env {
				env[e.Name] = e
			}
		}
		for ctx, c := range contexts {
			if !users[c["user"]] {
				t.Errorf("%s: context %s: user %q is no user of the servers", name, ctx, c["user"])
			}
			v, ok := strings.CutPrefix(c["password"], "env://")
			e := env[v]
			if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != defaults.secret || e.ValueFrom.SecretKeyRef.Key != c["user"] {
				t.Errorf("%s: context %s: password %q, want env:// of a variable from Secret %s key %s", name, ctx, c["password"], defaults.secret, c["user"])
			}
			if ctx != "default" && c["inbox_prefix"] != "_INBOX."+c["user"] {
				t.Errorf("%s: context %s: inbox prefix %q, want the user's _INBOX.%s", name, ctx, c["inbox_prefix"], c["user"])
			}
		}
	}
	for _, want := range []string{"default", "observer", "sys"} {
		if _, ok := contexts[want]; !ok {
			t.Errorf("nats-box has no context %s", want)
		}
	}
}

// startNATS runs one server of the rendered configuration, on loopback
// and free ports, alone (its routes dropped), storing in a temporary
// directory. reload reads the configuration again, with the same
// changes, and reloads the server with it, as the chart's reloader has
// nats-server do when a file changes.
func startNATS(t *testing.T, in natsInstall) (srv *server.Server, reload func() error) {
	t.Helper()
	port, httpPort, store := natstest.FreePort(t), natstest.FreePort(t), t.TempDir()
	load := func() (*server.Options, error) {
		opts, err := server.ProcessConfigFile(in.conf)
		if err != nil {
			return nil, err
		}
		opts.Host, opts.Port = "127.0.0.1", port
		opts.HTTPHost, opts.HTTPPort = "127.0.0.1", httpPort
		opts.Cluster = server.ClusterOpts{}
		opts.Routes, opts.RoutesStr = nil, ""
		opts.StoreDir = store
		opts.PidFile = ""
		opts.NoSigs, opts.NoLog = true, true
		return opts, nil
	}
	opts, err := load()
	if err != nil {
		t.Fatal(err)
	}
	srv = natstest.RunServer(t, opts)
	return srv, func() error {
		o, err := load()
		if err != nil {
			return err
		}
		return srv.ReloadOptions(o)
	}
}

// TestNATSAcceptsTheCharts: a server of the rendered NATS configuration,
// with bcrypt hashes, takes the broker and an agent as the Switchyard
// chart renders them (each with the plain password of Secret
// switchyard-nats): the broker's jobs stream and readiness, the agent's
// readiness. The probe's request and reply (the `helm test`) work in its
// own account, which sees nothing of Switchyard's; the system user's
// server ping (nats server ls) and the observer's stream info answer.
// A new hash in the file, reloaded, takes the new password and refuses
// the old.
func TestNATSAcceptsTheCharts(t *testing.T) {
	in := renderNATS(t)
	srv, reload := startNATS(t, in)
	chart := chartDir(t)
	objs := render(t, chart, []string{filepath.Join(chart, "examples", "vllm-regular.yaml")})

	b := brokerIn(objs)
	httpPort := natstest.FreePort(t)
	runContainer(t, "broker", b, brokercmd.Run, srv.ClientURL(), nil, func(a []string) []string {
		a = setFlag(a, "http", fmt.Sprintf("127.0.0.1:%d", httpPort))
		a = setFlag(a, "grpc", "")
		a = setFlag(a, "replicas", "1") // one server
		return setFlag(a, "shutdown-delay", "0s")
	})
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/readyz", httpPort), http.StatusOK)

	a := agentIn(objs, "regular")
	metricsPort := natstest.FreePort(t)
	runContainer(t, "agent", a, agentcmd.Run, srv.ClientURL(), nil, func(args []string) []string {
		args = setFlag(args, "metrics-listen", fmt.Sprintf("127.0.0.1:%d", metricsPort))
		return setFlag(args, "engine", "sim")
	})
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/readyz", metricsPort), http.StatusOK)

	connect := func(user, password string, opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect(srv.ClientURL(), append([]nats.Option{nats.UserInfo(user, password), nats.MaxReconnects(0)}, opts...)...)
	}

	// The helm test's request and reply, as the probe.
	probe, err := connect("probe", "secret-probe")
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	defer probe.Close()
	if _, err := probe.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if m, err := probe.Request("echo", []byte("hi"), 5*time.Second); err != nil || string(m.Data) != "hi" {
		t.Errorf("probe request on echo: %v %v", m, err)
	}
	hb, err := probe.SubscribeSync("sy.hb.>")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := hb.NextMsg(3 * time.Second); err == nil {
		t.Errorf("the probe sees Switchyard's heartbeats: %s", m.Subject)
	}

	// nats server ls: the system account's ping, as sys.
	sys, err := connect("sys", "secret-sys", nats.CustomInboxPrefix("_INBOX.sys"))
	if err != nil {
		t.Fatalf("sys: %v", err)
	}
	defer sys.Close()
	if m, err := sys.Request("$SYS.REQ.SERVER.PING", nil, 5*time.Second); err != nil || !strings.Contains(string(m.Data), `"name":"nats-0"`) {
		t.Errorf("sys: server ping: %v (%v)", err, m)
	}
	// nats stream info, as the observer.
	obs, err := connect("observer", "secret-observer", nats.CustomInboxPrefix("_INBOX.observer"))
	if err != nil {
		t.Fatalf("observer: %v", err)
	}
	if m, err := obs.Request("$JS.API.STREAM.INFO.SWITCHYARD_JOBS", nil, 5*time.Second); err != nil || !strings.Contains(string(m.Data), `"name":"SWITCHYARD_JOBS"`) {
		t.Errorf("observer: stream info: %v (%v)", err, m)
	}

	obs.Close()

	// Rotation: the observer's new hash, reloaded as the reloader would.
	in.writePasswords(t, map[string]string{"observer": "rotated"})
	if err := reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if c, err := connect("observer", "rotated"); err != nil {
		t.Errorf("observer with the new password after the reload: %v", err)
	} else {
		c.Close()
	}
	if c, err := connect("observer", "secret-observer"); err == nil {
		c.Close()
		t.Error("observer with the old password: accepted after the reload")
	}
	// A hash of a user the configuration does not have is an error: the
	// reload is refused and the server keeps what it had.
	good, err := os.ReadFile(in.passwords)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in.passwords, append(good, []byte(hashVar("nobody")+": \"$2a$04$x\"\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := reload(); err == nil {
		t.Error("a hashes file with a user nats.conf does not have: reloaded")
	} else {
		t.Logf("refused: %v", err)
	}
	if c, err := connect("observer", "rotated"); err != nil {
		t.Errorf("observer after a refused reload: %v", err)
	} else {
		c.Close()
	}

	// The others' connections and passwords stand.
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/readyz", httpPort), http.StatusOK)
	if c, err := connect("agent-regular", "secret-agent-regular"); err != nil {
		t.Errorf("agent-regular after another user's rotation: %v", err)
	} else {
		c.Close()
	}
}

// natscliVersion is the NATS CLI whose contexts nats-values.yaml writes
// (env:// passwords) and docs/operations.md's recipes name.
const natscliVersion = "v0.5.0"

// natsCLI returns the NATS CLI of natscliVersion, built once from the Go
// module proxy into the user's cache, outside this module (where
// internal/natsauth's recipe test builds it too).
func natsCLI(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "switchyard", "natscli-"+natscliVersion)
	bin := filepath.Join(dir, "nats")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	build := t.TempDir()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "install", "github.com/nats-io/natscli/nats@"+natscliVersion)
	cmd.Dir = build // no go.mod: the CLI's own module graph
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOBIN="+build)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the NATS CLI %s: %v\n%s", natscliVersion, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Rename is atomic: a concurrent run sees the whole binary or none.
	if err := os.Rename(filepath.Join(build, "nats"), bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestNATSBoxContexts runs the NATS CLI as the NATS chart's nats-box and
// `helm test` pods would: their contexts as the chart writes them (the
// server's URL moved to the test's), their environment from the Secret
// (podEnv's stand-ins), against a server of the rendered configuration
// with the brokers' stream. The test pod's script passes; the recipes of
// docs/operations.md that need the system account pass with the box's
// sys context, and a stream recipe with its observer context.
func TestNATSBoxContexts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the NATS CLI")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run the test pod's script")
	}
	recipes := sysRecipes(t)
	cli := natsCLI(t)
	in := renderNATS(t)
	srv, _ := startNATS(t, in)
	chart := chartDir(t)
	objs := render(t, chart, []string{filepath.Join(chart, "examples", "vllm-regular.yaml")})
	httpPort := natstest.FreePort(t)
	runContainer(t, "broker", brokerIn(objs), brokercmd.Run, srv.ClientURL(), nil, func(a []string) []string {
		a = setFlag(a, "http", fmt.Sprintf("127.0.0.1:%d", httpPort))
		a = setFlag(a, "grpc", "")
		a = setFlag(a, "replicas", "1")
		return setFlag(a, "shutdown-delay", "0s")
	})
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/readyz", httpPort), http.StatusOK)

	// The contexts, as nats-box's entrypoint links them: the default one
	// selected.
	home := t.TempDir()
	ctxDir := filepath.Join(home, ".config", "nats", "context")
	if err := os.MkdirAll(ctxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var box *appsv1.Deployment
	var test *corev1.Pod
	for _, o := range in.objs {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			box = v
		case *corev1.Pod:
			test = v
		case *corev1.Secret:
			for k, d := range v.StringData {
				if !strings.HasSuffix(k, ".json") {
					continue
				}
				var c map[string]any
				if err := json.Unmarshal([]byte(d), &c); err != nil {
					t.Fatal(err)
				}
				c["url"] = srv.ClientURL()
				b, _ := json.Marshal(c)
				if err := os.WriteFile(filepath.Join(ctxDir, k), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := os.WriteFile(filepath.Join(home, ".config", "nats", "context.txt"), []byte("default"), 0o600); err != nil {
		t.Fatal(err)
	}
	if box == nil || test == nil {
		t.Fatal("the NATS chart rendered no nats-box or no test pod")
	}
	env := func(c corev1.Container) []string {
		out := []string{
			"PATH=" + filepath.Dir(cli) + string(os.PathListSeparator) + os.Getenv("PATH"),
			"HOME=" + home,
			"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		}
		for k, v := range podEnv(c) {
			out = append(out, k+"="+v)
		}
		return out
	}
	run := func(t *testing.T, c corev1.Container, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = env(c)
		cmd.Dir = t.TempDir()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", args, err, out)
		}
		t.Logf("$ %s\n%s", strings.Join(args, " "), out)
		return string(out)
	}

	t.Run("helm test", func(t *testing.T) {
		c := test.Spec.Containers[0]
		if len(c.Args) != 3 || c.Args[0] != "sh" {
			t.Fatalf("test pod args %q: want sh -ec SCRIPT", c.Args)
		}
		// The script's scratch file, in a directory of the test's own.
		script := strings.ReplaceAll(c.Args[2], "/tmp/resp", filepath.Join(t.TempDir(), "resp"))
		run(t, c, "sh", c.Args[1], script)
	})
	c := box.Spec.Template.Spec.Containers[0]
	for _, r := range recipes {
		t.Run(r, func(t *testing.T) {
			out := run(t, c, "sh", "-c", strings.Replace(r, "--context sy-sys", "--context sys", 1))
			if !strings.Contains(out, "nats-0") {
				t.Errorf("%s: the server nats-0 is not in the output", r)
			}
		})
	}
	t.Run("observer", func(t *testing.T) {
		out := run(t, c, cli, "--context", "observer", "stream", "info", "SWITCHYARD_JOBS")
		if !strings.Contains(out, "Information for Stream SWITCHYARD_JOBS") {
			t.Error("no stream information")
		}
	})
}

// sysRecipes are the NATS CLI recipes of docs/operations.md that use the
// system account's context (sy-sys), without their comments.
func sysRecipes(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(cmdtest.RepoRoot(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "nats --context sy-sys ") {
			cmd, _, _ := strings.Cut(line, " #")
			out = append(out, strings.TrimSpace(cmd))
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/operations.md has no recipe with the system account's context sy-sys")
	}
	return out
}
