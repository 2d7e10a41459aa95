//go:build unix

package helmtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// TestChartsAsProcesses is the charts' end-to-end test without a cluster.
// It renders the official NATS chart with deploy/helm/nats-values.yaml and
// the Switchyard chart with each values set, and runs every pod as
// processes with its rendered command line, configuration and
// environment: the NATS StatefulSet's pods as nats-servers built from the
// module's pinned version, the brokers and agents as the commands built
// from ./cmd, and each engine container as a sim-engine speaking its
// engine's protocol in its PD role. The test gives only what a cluster
// gives (podrun_test.go): pod names and addresses, the Services' and the
// pods' DNS names as loopback ports, volumes as directories, and the
// Secrets an operator creates (natsSecrets): the clients' passwords, and
// their bcrypt hashes mounted into the servers, which check every
// connection's password against them and refuse a wrong one.
//
// Through every broker's HTTP ingress it serves chat, streaming and not,
// on each model of the fleet (prefill then decode where the fleet is
// disaggregated). Then it kills, with SIGKILL, the NATS server leading the
// jobs stream and one broker, waits until the cluster has elected new
// leaders, and wants every request to the surviving brokers to succeed.
func TestChartsAsProcesses(t *testing.T) {
	root := cmdtest.RepoRoot(t)
	natsChart := officialNATSChart(t)
	if testing.Short() {
		t.Skip("skipped in -short mode: runs a NATS cluster, brokers, agents and engines as processes")
	}
	const mod = "github.com/switchyard-ai/switchyard/cmd/"
	bins := map[string]string{
		"nats-server":  cmdtest.NATSServerBinary(t),
		"broker":       cmdtest.BuildBinary(t, mod+"broker", "broker", false),
		"worker-agent": cmdtest.BuildBinary(t, mod+"worker-agent", "worker-agent", false),
		"sim-engine":   cmdtest.BuildBinary(t, mod+"sim-engine", "sim-engine", false),
	}
	natsObjs := renderNATSChart(t, natsChart, filepath.Join(root, "deploy", "helm", "nats-values.yaml"))

	sets := valueSets(t)
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		t.Run(name, func(t *testing.T) {
			runFleet(t, bins, natsObjs, render(t, chartDir(t), sets[name]))
		})
	}
}

// renderNATSChart renders the NATS chart as release "nats" (the name the
// Switchyard chart's default nats.url reaches) and decodes the objects the
// test runs; others (the nats-box and helm test pods, the ServiceAccount)
// are skipped.
func renderNATSChart(t *testing.T, chart, values string) []object {
	t.Helper()
	out, err := helm(t, "template", "nats", chart, "--namespace", testNamespace, "--kube-version", kubeVersion, "-f", values)
	if err != nil {
		t.Fatal(err)
	}
	var objs []object
	for _, doc := range docSep.Split(out, -1) {
		if onlySpace.MatchString(doc) {
			continue
		}
		o, err := decodeStrict(doc)
		if err != nil {
			if strings.Contains(err.Error(), "no Go type known") {
				continue
			}
			t.Fatalf("NATS chart: %v", err)
		}
		objs = append(objs, o)
	}
	return objs
}

// imageName is the last element of an image's repository.
func imageName(image string) string {
	repo := image
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return repo[strings.LastIndex(repo, "/")+1:]
}

// fleet is a running rendering: its pods as processes.
type fleet struct {
	t       *testing.T
	c       *cluster
	ps      *procs
	bins    map[string]string
	nats    []*podProc // one nats-server per pod
	brokers []*podProc
	agents  []*podProc
	apiKey  string // the brokers' API key, if the rendering sets one
}

// podProc is a container of a pod running as a process.
type podProc struct {
	pod   *runPod
	ct    corev1.Container
	args  []string // as run
	env   map[string]string
	proc  *proc
	ready string // the URL of its readiness probe
}

func (pp *podProc) flag(name string) string {
	v, _ := cmdtest.FlagValue(pp.args, name)
	return v
}

func runFleet(t *testing.T, bins map[string]string, natsObjs, objs []object) {
	start := time.Now()
	f := &fleet{t: t, bins: bins, ps: newProcs(t)}
	f.c = newCluster(t, natsSecrets(t, testSecrets(natsObjs, objs)), natsObjs, objs)

	// Every pod first, so that a Service resolves to all its pods.
	var natsPods, brokerPods, poolPods []*runPod
	for _, o := range natsObjs {
		if o.kind == "StatefulSet" {
			natsPods = append(natsPods, f.c.podsOf(o)...)
		}
	}
	for _, w := range workloads(objs) {
		o := f.c.workload(w.kind, w.name)
		if _, ok := agentOf(w); ok {
			poolPods = append(poolPods, f.c.podsOf(o)...)
			continue
		}
		for _, ct := range w.spec.Containers {
			if binaryOf(ct.Image) == "broker" {
				brokerPods = append(brokerPods, f.c.podsOf(o)...)
				break
			}
		}
	}
	// Every declared port's loopback port is taken before any process
	// starts, so that no connection's source port takes it meanwhile.
	for _, p := range f.c.pods {
		for _, ct := range p.spec.Containers {
			for _, cp := range ct.Ports {
				p.port(t, cp.ContainerPort)
			}
		}
	}
	if len(natsPods) < 3 || len(brokerPods) < 2 {
		t.Fatalf("rendered %d NATS pods and %d brokers: the test needs a NATS cluster of 3 and 2 brokers to kill one of each", len(natsPods), len(brokerPods))
	}

	for _, p := range natsPods {
		f.startNATS(p)
	}
	for _, n := range f.nats {
		f.waitReady(n, 90*time.Second)
	}
	t.Logf("%v: %d NATS servers ready", time.Since(start).Round(100*time.Millisecond), len(f.nats))
	f.checkNATSAuth()
	for _, p := range brokerPods {
		f.startBroker(p)
	}
	for _, b := range f.brokers {
		f.waitReady(b, 60*time.Second)
	}
	t.Logf("%v: %d brokers ready", time.Since(start).Round(100*time.Millisecond), len(f.brokers))
	for _, p := range poolPods {
		f.startPoolPod(p)
	}
	for _, a := range f.agents {
		f.waitReady(a, 60*time.Second)
	}
	t.Logf("%v: %d engine pods ready", time.Since(start).Round(100*time.Millisecond), len(f.agents))
	if len(f.agents) == 0 {
		t.Log("no engine pool rendered: each broker answers its model list, with no model to serve")
	}
	for _, b := range f.brokers {
		f.waitFleet(b)
	}

	// Chat and PD through every broker.
	for _, b := range f.brokers {
		for i := range 3 {
			f.serveAll(b, fmt.Sprintf("before the faults %d", i))
		}
	}

	t.Logf("%v: served through every broker", time.Since(start).Round(100*time.Millisecond))

	// The loss: the NATS server leading the jobs stream, and a broker.
	lost := f.streamLeader()
	t.Logf("SIGKILL NATS server %s (the jobs stream's leader) and broker %s", lost.pod.name, f.brokers[0].pod.name)
	lost.proc.kill()
	f.brokers[0].proc.kill()
	survivors := f.brokers[1:]
	f.waitElected(lost, survivors)
	for _, b := range survivors {
		for i := range 5 {
			f.serveAll(b, fmt.Sprintf("after the faults %d", i))
		}
	}
	t.Logf("the fleet served, lost a NATS server and a broker, and served again in %v", time.Since(start).Round(100*time.Millisecond))
}

// natsSecrets completes the test's Secrets as docs/kubernetes.md has an
// operator create them for nats-values.yaml: in the clients' Secret, a
// password for every NATS user, whether a rendered pod reads it or not;
// in Secret switchyard-nats-auth, the bcrypt hash of each (hashesFile),
// which the servers include and check every connection's password
// against.
func natsSecrets(t *testing.T, s map[string]map[string]string) map[string]map[string]string {
	t.Helper()
	clients := s[defaults.secret]
	if clients == nil {
		clients = map[string]string{}
		s[defaults.secret] = clients
	}
	for _, u := range natsUsers {
		if _, ok := clients[u]; !ok {
			clients[u] = randomPassword()
		}
	}
	s[natsAuthSecret] = map[string]string{"passwords.conf": hashesFile(t, clients)}
	return s
}

// startNATS runs the nats-server container of a NATS pod with its
// rendered arguments and environment, and its configuration files
// rewritten for loopback (rewriteNATSConf).
func (f *fleet) startNATS(p *runPod) {
	t := f.t
	for _, ct := range p.spec.Containers {
		if imageName(ct.Image) != "nats" {
			continue // the config reloader and the exporter
		}
		if len(ct.Command) > 0 {
			t.Fatalf("pod %s: nats container command %q: the test runs the image's nats-server", p.name, ct.Command)
		}
		env := f.c.env(p, ct)
		args := f.c.rewriteArgs(p, ct, ct.Args, env)
		for _, m := range ct.VolumeMounts {
			for _, v := range p.spec.Volumes {
				if v.Name != m.Name || v.ConfigMap == nil {
					continue
				}
				dir := f.c.volume(p, v.Name)
				for key, text := range f.c.configMaps[v.ConfigMap.Name] {
					if !strings.HasSuffix(key, ".conf") {
						continue
					}
					conf, err := f.c.rewriteNATSConf(p, ct, path.Join(m.MountPath, key), text)
					if err != nil {
						t.Fatalf("pod %s: %s: %v", p.name, key, err)
					}
					if err := os.WriteFile(filepath.Join(dir, key), []byte(conf), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		pp := &podProc{pod: p, ct: ct, args: args, env: env}
		pp.proc = f.ps.start(p.name+"/"+ct.Name, f.bins["nats-server"], args, envList(env), t.TempDir())
		pp.ready = f.c.probeURL(p, ct, firstProbe(ct.StartupProbe, ct.ReadinessProbe))
		if pp.ready == "" {
			t.Fatalf("pod %s: the nats container has no HTTP probe to wait on", p.name)
		}
		f.nats = append(f.nats, pp)
		return
	}
	t.Fatalf("pod %s has no nats container", p.name)
}

// checkNATSAuth: each server admits a user with its password from the
// clients' Secret, which only the hashes mounted from Secret
// switchyard-nats-auth can check, and refuses a wrong password.
func (f *fleet) checkNATSAuth() {
	t := f.t
	t.Helper()
	user := "probe"
	pw := f.c.secrets[defaults.secret][user]
	for _, n := range f.nats {
		cp, ok := containerPort(n.ct, intstr.FromString("nats"))
		if !ok {
			t.Fatalf("pod %s: the nats container has no port named nats", n.pod.name)
		}
		u := fmt.Sprintf("nats://127.0.0.1:%d", n.pod.port(t, cp))
		nc, err := nats.Connect(u, nats.UserInfo(user, pw), nats.MaxReconnects(0))
		if err != nil {
			t.Fatalf("%s: user %s with the password of Secret %s: %v", n.pod.name, user, defaults.secret, err)
		}
		nc.Close()
		if nc, err := nats.Connect(u, nats.UserInfo(user, pw+"x"), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatalf("%s: user %s with a wrong password: admitted", n.pod.name, user)
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("%s: user %s with a wrong password: %v, want an authorization violation", n.pod.name, user, err)
		}
	}
}

func firstProbe(ps ...*corev1.Probe) *corev1.Probe {
	for _, p := range ps {
		if p != nil && p.HTTPGet != nil {
			return p
		}
	}
	return nil
}

// startBroker runs a broker pod's container.
func (f *fleet) startBroker(p *runPod) {
	t := f.t
	for _, ct := range p.spec.Containers {
		if binaryOf(ct.Image) != "broker" {
			continue
		}
		env := f.c.env(p, ct)
		args := f.c.rewriteArgs(p, ct, ct.Args, env)
		pp := &podProc{pod: p, ct: ct, args: args, env: env}
		pp.proc = f.ps.start(p.name+"/"+ct.Name, f.bins["broker"], args, envList(env), t.TempDir())
		pp.ready = f.c.probeURL(p, ct, ct.ReadinessProbe)
		if pp.ready == "" {
			t.Fatalf("pod %s: the broker has no HTTP readiness probe", p.name)
		}
		if k := env["SWITCHYARD_API_KEY"]; k != "" {
			f.apiKey = k
		}
		f.brokers = append(f.brokers, pp)
	}
}

// startPoolPod runs an engine pod: a sim-engine standing in for the engine
// container, on the port the agent dials, with the agent's model and role
// and its engine's PD protocol; then the agent.
func (f *fleet) startPoolPod(p *runPod) {
	t := f.t
	var agent corev1.Container
	var engines []corev1.Container
	for _, ct := range p.spec.Containers {
		if binaryOf(ct.Image) == "worker-agent" {
			agent = ct
		} else {
			engines = append(engines, ct)
		}
	}
	if len(engines) == 0 {
		t.Fatalf("pod %s has an agent and no engine", p.name)
	}
	if len(engines) > 1 {
		t.Logf("pod %s: containers after the engine (%s) are not run", p.name, engines[1].Name)
	}
	engine := engines[0]
	aenv := f.c.env(p, agent)
	aargs := f.c.rewriteArgs(p, agent, agent.Args, aenv)
	a := &podProc{pod: p, ct: agent, args: aargs, env: aenv}

	// The engine: what the agent dials, as the engine container serves it.
	eenv := f.c.env(p, engine)
	dial := a.flag("engine-url")
	hostport := strings.TrimPrefix(strings.TrimPrefix(dial, "http://"), "https://")
	if !strings.HasPrefix(hostport, "127.0.0.1:") {
		t.Fatalf("pod %s: the agent dials its engine at %q, not on the pod's loopback", p.name, dial)
	}
	role := a.flag("role")
	sim := []string{"--listen", hostport, "--model", a.flag("model"), "--role", role,
		"--slots", a.flag("slots"), "--ttft", "2ms", "--itl", "1ms"}
	switch kind := a.flag("engine"); kind {
	case "vllm", "sglang":
		sim = append(sim, "--pd-protocol", kind)
	case "vllm-grpc":
		sim = slices.Concat(sim[:0:0], []string{"--grpc-listen", hostport, "--listen", "127.0.0.1:0"}, sim[2:])
	}
	if role == "prefill" {
		// The KV side channel that decode engines dial: SGLang's
		// bootstrap port, or vLLM NIXL's side channel.
		port := ""
		if v, ok := cmdtest.FlagValue(engine.Args, "disaggregation-bootstrap-port"); ok {
			port = v
		} else if v, ok := eenv["VLLM_NIXL_SIDE_CHANNEL_PORT"]; ok {
			port = v
		}
		bp := 0
		if n, err := strconv.Atoi(port); err == nil {
			bp = p.port(t, int32(n))
		}
		sim = append(sim, "--bootstrap-host", "127.0.0.1", "--bootstrap-port", strconv.Itoa(bp))
		if s, ok := eenv["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"]; ok {
			sim = append(sim, "--kv-hold-timeout", s+"s")
		}
	}
	e := &podProc{pod: p, ct: engine, args: sim, env: eenv}
	e.proc = f.ps.start(p.name+"/"+engine.Name+"(sim-engine)", f.bins["sim-engine"], sim, nil, t.TempDir())
	if u := f.c.probeURL(p, engine, firstProbe(engine.StartupProbe, engine.ReadinessProbe)); u != "" {
		e.ready = u
		f.waitReady(e, 30*time.Second)
	}

	a.proc = f.ps.start(p.name+"/"+agent.Name, f.bins["worker-agent"], aargs, envList(aenv), t.TempDir())
	a.ready = f.c.probeURL(p, agent, agent.ReadinessProbe)
	if a.ready == "" {
		t.Fatalf("pod %s: the agent has no HTTP readiness probe", p.name)
	}
	f.agents = append(f.agents, a)
}

var probeClient = &http.Client{Timeout: 5 * time.Second}

// waitReady waits for a container's probe to answer 200 while its process
// runs.
func (f *fleet) waitReady(pp *podProc, total time.Duration) {
	f.t.Helper()
	testwait.For(f.t, total, 50*time.Millisecond, func() error {
		if err := pp.proc.exited(); err != nil {
			f.t.Fatalf("%v before it was ready; its output:\n%s", err, pp.proc.tail())
		}
		return probe(pp.ready)
	})
}

func probe(u string) error {
	resp, err := probeClient.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// brokerURL is the base URL of a broker's HTTP ingress: the port the
// broker Service's http port reaches in the broker's pod.
func (f *fleet) brokerURL(b *podProc) string {
	for _, s := range f.c.services() {
		if !slices.Contains(s.pods, b.pod) {
			continue
		}
		for _, sp := range s.Spec.Ports {
			if sp.Name != "http" {
				continue
			}
			if cp, ok := b.pod.namedPort(sp.TargetPort); ok {
				return fmt.Sprintf("http://127.0.0.1:%d", b.pod.port(f.t, cp))
			}
		}
	}
	f.t.Fatalf("no Service port named http reaches broker %s", b.pod.name)
	return ""
}

func (f *fleet) get(u string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if f.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+f.apiKey)
	}
	return probeClient.Do(req)
}

// fleetAgent is an agent as a broker's /v1/fleet lists it.
type fleetAgent struct {
	ID       string `json:"id"`
	Eligible bool   `json:"eligible"`
	Reason   string `json:"reason"`
}

// waitFleet waits until the broker holds every running agent as eligible
// and reads its batches' store (an Object Store and a KV bucket) with the
// chart's NATS permissions.
func (f *fleet) waitFleet(b *podProc) {
	f.t.Helper()
	var want []string
	for _, a := range f.agents {
		want = append(want, a.env["SWITCHYARD_ID"])
	}
	testwait.For(f.t, 60*time.Second, 50*time.Millisecond, func() error {
		resp, err := f.get(f.brokerURL(b) + "/v1/fleet")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var fl struct {
			Agents       []fleetAgent    `json:"agents"`
			Batches      json.RawMessage `json:"batches"`
			BatchesError string          `json:"batches_error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&fl); err != nil {
			return fmt.Errorf("broker %s /v1/fleet: %s: %v", b.pod.name, resp.Status, err)
		}
		if fl.Batches == nil {
			return fmt.Errorf("broker %s /v1/fleet has no batches: %s", b.pod.name, fl.BatchesError)
		}
		for _, id := range want {
			i := slices.IndexFunc(fl.Agents, func(a fleetAgent) bool { return a.ID == id })
			if i < 0 || !fl.Agents[i].Eligible {
				return fmt.Errorf("broker %s: agent %s not eligible in %+v", b.pod.name, id, fl.Agents)
			}
		}
		return nil
	})
}

// models lists the fleet's models with the roles of their agents' pools
// and the agents (pod names) of each role.
func (f *fleet) models() map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, a := range f.agents {
		m := a.flag("model")
		if out[m] == nil {
			out[m] = map[string][]string{}
		}
		out[m][a.flag("role")] = append(out[m][a.flag("role")], a.env["SWITCHYARD_ID"])
	}
	return out
}

// serveAll sends, through broker b, one chat request and one streamed
// chat request per model, and checks each answer against the simulator's
// and the route against the fleet: PD where the model has prefill and
// decode pools and no regular one. A fleet without models gets its model
// list.
func (f *fleet) serveAll(b *podProc, tag string) {
	t := f.t
	t.Helper()
	base := f.brokerURL(b)
	key := f.apiKey
	if key == "" {
		key = "unused"
	}
	client := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0),
		option.WithRequestTimeout(60*time.Second))
	models := f.models()
	if len(models) == 0 {
		resp, err := f.get(base + "/v1/models")
		if err != nil {
			t.Fatalf("broker %s /v1/models: %v", b.pod.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("broker %s /v1/models: %s", b.pod.name, resp.Status)
		}
		return
	}
	for _, m := range slices.Sorted(maps.Keys(models)) {
		roles := models[m]
		pd := len(roles["regular"]) == 0 && len(roles["prefill"]) > 0 && len(roles["decode"]) > 0
		for _, stream := range []bool{false, true} {
			prompt := fmt.Sprintf("%s via %s, stream %v", tag, b.pod.name, stream)
			what := fmt.Sprintf("broker %s, model %s, stream %v, prompt %q", b.pod.name, m, stream, prompt)
			want, err := simengine.Expect(simengine.APIChat, fmt.Appendf(nil, `{"messages":[{"role":"user","content":%q}],"max_tokens":8}`, prompt))
			if err != nil {
				t.Fatal(err)
			}
			params := openai.ChatCompletionNewParams{Model: m, MaxTokens: openai.Int(8),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
			var resp *http.Response
			got := ""
			ctx := context.Background()
			if stream {
				s := client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&resp))
				for s.Next() {
					if c := s.Current(); len(c.Choices) > 0 {
						got += c.Choices[0].Delta.Content
					}
				}
				err = s.Err()
			} else {
				var cc *openai.ChatCompletion
				if cc, err = client.Chat.Completions.New(ctx, params, option.WithResponseInto(&resp)); err == nil && len(cc.Choices) > 0 {
					got = cc.Choices[0].Message.Content
				}
			}
			if err != nil {
				var apiErr *openai.Error
				if errors.As(err, &apiErr) {
					t.Fatalf("%s: %d %s", what, apiErr.StatusCode, apiErr.RawJSON())
				}
				t.Fatalf("%s: %v", what, err)
			}
			if got != want.Text {
				t.Fatalf("%s: answer %q, want the engine's %q", what, got, want.Text)
			}
			route, agents := resp.Header.Get("X-Switchyard-Route"), strings.Split(resp.Header.Get("X-Switchyard-Agent"), ",")
			switch {
			case pd:
				if route != "pd" || len(agents) != 2 || !slices.Contains(roles["prefill"], agents[0]) || !slices.Contains(roles["decode"], agents[1]) {
					t.Fatalf("%s: route %q by agents %q, want pd by a prefill agent of %q then a decode agent of %q", what, route, agents, roles["prefill"], roles["decode"])
				}
			default:
				if route != "regular" || len(agents) != 1 || !slices.Contains(roles["regular"], agents[0]) {
					t.Fatalf("%s: route %q by agents %q, want regular by one of %q", what, route, agents, roles["regular"])
				}
			}
		}
	}
}

// jsz is the part of a NATS server's /jsz?consumers=true the test reads.
type jsz struct {
	AccountDetails []struct {
		Name    string `json:"name"`
		Streams []struct {
			Name    string      `json:"name"`
			Cluster clusterInfo `json:"cluster"`
			Cons    []struct {
				Name    string      `json:"name"`
				Cluster clusterInfo `json:"cluster"`
			} `json:"consumer_detail"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

type clusterInfo struct {
	Leader string `json:"leader"`
}

// monitor is the base URL of a NATS pod's monitoring port.
func (f *fleet) monitor(n *podProc) string {
	u, err := url.Parse(n.ready)
	if err != nil {
		f.t.Fatal(err)
	}
	return u.Scheme + "://" + u.Host
}

func (f *fleet) jsz(n *podProc) (jsz, error) {
	var z jsz
	resp, err := probeClient.Get(f.monitor(n) + "/jsz?accounts=true&streams=true&consumers=true")
	if err != nil {
		return z, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return z, fmt.Errorf("%s /jsz: %s", n.pod.name, resp.Status)
	}
	return z, json.NewDecoder(resp.Body).Decode(&z)
}

// streamLeader returns the NATS pod leading the jobs stream (the first
// stream of the cluster); the first pod if none is found.
func (f *fleet) streamLeader() *podProc {
	var leader string
	testwait.For(f.t, 30*time.Second, 100*time.Millisecond, func() error {
		z, err := f.jsz(f.nats[0])
		if err != nil {
			return err
		}
		for _, a := range z.AccountDetails {
			for _, s := range a.Streams {
				if s.Cluster.Leader != "" {
					leader = s.Cluster.Leader
					return nil
				}
			}
		}
		return fmt.Errorf("no stream with a leader in %+v", z)
	})
	for _, n := range f.nats {
		if n.env["SERVER_NAME"] == leader || n.pod.name == leader {
			return n
		}
	}
	f.t.Fatalf("the jobs stream's leader %q is no NATS pod", leader)
	return nil
}

// waitElected waits until, without the lost server, every surviving NATS
// server is healthy and sees a leader other than the lost one for every
// stream and consumer, and every surviving broker and every agent is
// ready again with every agent eligible.
func (f *fleet) waitElected(lost *podProc, brokers []*podProc) {
	t := f.t
	t.Helper()
	start := time.Now()
	lostName := lost.env["SERVER_NAME"]
	testwait.For(t, 90*time.Second, 100*time.Millisecond, func() error {
		for _, n := range f.nats {
			if n == lost {
				continue
			}
			if err := n.proc.exited(); err != nil {
				return err
			}
			if err := probe(f.monitor(n) + "/healthz"); err != nil {
				return err
			}
			z, err := f.jsz(n)
			if err != nil {
				return err
			}
			streams := 0
			for _, a := range z.AccountDetails {
				for _, s := range a.Streams {
					streams++
					if s.Cluster.Leader == "" || s.Cluster.Leader == lostName {
						return fmt.Errorf("%s: stream %s led by %q", n.pod.name, s.Name, s.Cluster.Leader)
					}
					for _, c := range s.Cons {
						if c.Cluster.Leader == "" || c.Cluster.Leader == lostName {
							return fmt.Errorf("%s: consumer %s led by %q", n.pod.name, c.Name, c.Cluster.Leader)
						}
					}
				}
			}
			if streams == 0 {
				return fmt.Errorf("%s: no stream", n.pod.name)
			}
		}
		for _, pp := range append(slices.Clone(brokers), f.agents...) {
			if err := pp.proc.exited(); err != nil {
				t.Fatalf("%v; its output:\n%s", err, pp.proc.tail())
			}
			if err := probe(pp.ready); err != nil {
				return err
			}
		}
		return nil
	})
	for _, b := range brokers {
		f.waitFleet(b)
	}
	t.Logf("leaders elected and every pod ready again %v after the kills", time.Since(start).Round(100*time.Millisecond))
}
