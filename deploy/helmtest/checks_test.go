package helmtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// agentPullWait bounds how long a draining agent's last pull request
// lives after its drain timeout (docs/operations.md: "pull wait 2 s").
const agentPullWait = 2 * time.Second

var usageFlag = regexp.MustCompile(`(?m)^  --?([A-Za-z0-9][-A-Za-z0-9_.]*)`)

var (
	flagsMu    sync.Mutex
	flagsCache map[string]map[string]bool
)

// commandFlags asks the broker and the agent, in-process, which flags they
// accept (their -h usage).
func commandFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if flagsCache != nil {
		return flagsCache
	}
	flags := map[string]map[string]bool{}
	for name, run := range map[string]func(context.Context, []string, func(string) string, io.Writer, io.Writer) error{
		"broker":       brokercmd.Run,
		"worker-agent": agentcmd.Run,
	} {
		var stderr bytes.Buffer
		if err := run(context.Background(), []string{"-h"}, func(string) string { return "" }, io.Discard, &stderr); err != nil {
			t.Fatalf("%s -h: %v", name, err)
		}
		known := map[string]bool{}
		for _, m := range usageFlag.FindAllStringSubmatch(stderr.String(), -1) {
			known[m[1]] = true
		}
		if len(known) < 10 {
			t.Fatalf("%s -h listed %d flags:\n%s", name, len(known), stderr.String())
		}
		flags[name] = known
	}
	flagsCache = flags
	return flags
}

// setFlag returns args with --name's value replaced (or the flag added).
func setFlag(args []string, name, value string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--"+name && i+1 < len(out) {
			out[i+1] = value
			return out
		}
	}
	return append(out, "--"+name, value)
}

// binaryOf names the Switchyard command an image runs, from the last
// element of its repository (the Dockerfile's targets); "" for others.
func binaryOf(image string) string {
	repo := image
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	switch repo[strings.LastIndex(repo, "/")+1:] {
	case "broker":
		return "broker"
	case "worker-agent":
		return "worker-agent"
	}
	return ""
}

// envFlag maps SWITCHYARD_NATS_URL to nats-url, as internal/cli does.
func envFlag(env string) (string, bool) {
	rest, ok := strings.CutPrefix(env, "SWITCHYARD_")
	if !ok {
		return "", false
	}
	return strings.ReplaceAll(strings.ToLower(rest), "_", "-"), true
}

// workload is a rendered pod template and the object that owns it.
type workload struct {
	kind, name  string
	replicas    *int32
	labels      map[string]string
	annotations map[string]string
	spec        corev1.PodSpec
}

func workloads(objs []object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{"Deployment", v.Name, v.Spec.Replicas, v.Spec.Template.Labels, v.Spec.Template.Annotations, v.Spec.Template.Spec})
		case *appsv1.StatefulSet:
			out = append(out, workload{"StatefulSet", v.Name, v.Spec.Replicas, v.Spec.Template.Labels, v.Spec.Template.Annotations, v.Spec.Template.Spec})
		}
	}
	return out
}

// expect is what the values given to the chart ask of the rendering.
type expect struct {
	natsURL      string
	secret       string
	brokers      int32
	jobsReplicas string
	// namespace is the release's: the brokers' series the scalers read.
	namespace string
}

var defaults = expect{
	natsURL:      "nats://nats:4222",
	secret:       "switchyard-nats",
	brokers:      2,
	jobsReplicas: "3",
	namespace:    "sy",
}

// endpointPropagation is what the shutdown delay allows, beyond the
// readiness probe's time to see a SIGTERM, for the pod's endpoints to
// leave every node's proxy and the ingresses.
const endpointPropagation = 3 * time.Second

// containerPort resolves a probe's port (a number or a port name) in c.
func containerPort(c corev1.Container, p intstr.IntOrString) (int32, bool) {
	if p.Type == intstr.Int {
		return p.IntVal, true
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func hostPort(t testing.TB, where, addr string) (string, int32) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: %q is no host:port: %v", where, addr, err)
		return "", 0
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Errorf("%s: port of %q: %v", where, addr, err)
	}
	return h, int32(n)
}

func seconds(t testing.TB, where, d string) time.Duration {
	t.Helper()
	v, err := time.ParseDuration(d)
	if err != nil {
		t.Errorf("%s: %q is no duration: %v", where, d, err)
	}
	return v
}

var secretName = regexp.MustCompile(`(?i)password|token|secret|api_?key|credential`)

// checkObjects runs every check that needs no running process on one
// rendering of the chart.
func checkObjects(t testing.TB, objs []object, flags map[string]map[string]bool, want expect) {
	t.Helper()
	ws := workloads(objs)
	byName := map[string]workload{}
	brokers := 0
	for _, w := range ws {
		byName[w.kind+"/"+w.name] = w
		where := w.kind + " " + w.name
		checkPodSecurity(t, where, w)
		for _, c := range w.spec.Containers {
			checkContainer(t, where, w, c, flags, want)
			switch binaryOf(c.Image) {
			case "broker":
				brokers++
				checkBroker(t, where, w, c, want)
			case "worker-agent":
				checkAgent(t, where, w, c)
			}
		}
		for _, c := range w.spec.InitContainers {
			checkContainer(t, where, w, c, flags, want)
		}
		volumes := map[string]bool{}
		for _, v := range w.spec.Volumes {
			volumes[v.Name] = true
		}
		for _, c := range append(slices.Clone(w.spec.Containers), w.spec.InitContainers...) {
			for _, m := range c.VolumeMounts {
				if !volumes[m.Name] {
					t.Errorf("%s container %s: mounts %s, which is no volume of the pod", where, c.Name, m.Name)
				}
			}
		}
	}
	for _, o := range objs {
		where := o.kind + " " + o.name
		switch v := o.obj.(type) {
		case *corev1.Secret:
			t.Errorf("%s: the chart renders no Secret: credentials come from the user's", where)
		case *corev1.Service:
			matched := matching(ws, v.Spec.Selector)
			if len(matched) == 0 {
				t.Errorf("%s: selects no pod", where)
			}
			for _, w := range matched {
				for _, sp := range v.Spec.Ports {
					found := false
					for _, c := range w.spec.Containers {
						if _, ok := containerPort(c, sp.TargetPort); ok {
							found = true
						}
					}
					if !found {
						t.Errorf("%s: port %s targets %s, which no container of %s declares", where, sp.Name, sp.TargetPort.String(), w.name)
					}
				}
			}
		case *policyv1.PodDisruptionBudget:
			if v.Spec.Selector == nil || len(matching(ws, v.Spec.Selector.MatchLabels)) == 0 {
				t.Errorf("%s: selects no pod", where)
			}
		case *ScaledObject:
			checkScaledObject(t, where, v, byName, want)
		case *ServiceMonitor:
			if len(v.Spec.Endpoints) == 0 || v.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("%s: endpoints %+v: want /metrics", where, v.Spec.Endpoints)
			}
		}
	}
	if brokers == 0 {
		t.Errorf("no broker container rendered")
	}
}

func matching(ws []workload, sel map[string]string) []workload {
	var out []workload
	for _, w := range ws {
		ok := len(sel) > 0
		for k, v := range sel {
			if w.labels[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, w)
		}
	}
	return out
}

// checkContainer: flags the real command accepts, secrets from Secrets.
func checkContainer(t testing.TB, where string, w workload, c corev1.Container, flags map[string]map[string]bool, want expect) {
	t.Helper()
	where += " container " + c.Name
	for _, e := range c.Env {
		if secretName.MatchString(e.Name) && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("%s: env %s is a secret but not read from a Secret (value %q)", where, e.Name, e.Value)
		}
	}
	bin := binaryOf(c.Image)
	if bin == "" {
		return
	}
	if len(c.Command) > 0 {
		t.Errorf("%s: command %q overrides the image's entrypoint (%s)", where, c.Command, bin)
	}
	known := flags[bin]
	for _, f := range cmdtest.SplitFlags(c.Args) {
		if !known[f.Name] {
			t.Errorf("%s: %s has no flag --%s", where, bin, f.Name)
		}
		if secretName.MatchString(f.Name) {
			t.Errorf("%s: --%s on the command line: secrets come from Secrets through the environment", where, f.Name)
		}
	}
	for _, e := range c.Env {
		if name, ok := envFlag(e.Name); ok && !known[name] {
			t.Errorf("%s: env %s names no flag of %s", where, e.Name, bin)
		}
	}
	checkGoRuntime(t, where, c)
	if u, _ := cmdtest.FlagValue(c.Args, "nats-url"); u != want.natsURL {
		t.Errorf("%s: --nats-url %q, want the values' %q", where, u, want.natsURL)
	}
	user, ok := cmdtest.FlagValue(c.Args, "nats-user")
	if !ok {
		t.Errorf("%s: no --nats-user", where)
	}
	pw := false
	for _, e := range c.Env {
		if e.Name != "SWITCHYARD_NATS_PASSWORD" {
			continue
		}
		pw = true
		if r := e.ValueFrom; r == nil || r.SecretKeyRef == nil || r.SecretKeyRef.Name != want.secret || r.SecretKeyRef.Key != user {
			t.Errorf("%s: SWITCHYARD_NATS_PASSWORD from %+v, want Secret %s key %s", where, e.ValueFrom, want.secret, user)
		}
	}
	if !pw {
		t.Errorf("%s: no SWITCHYARD_NATS_PASSWORD from the credentials Secret", where)
	}
}

func checkBroker(t testing.TB, where string, w workload, c corev1.Container, want expect) {
	t.Helper()
	if w.replicas == nil || *w.replicas != want.brokers {
		t.Errorf("%s: replicas %v, want %d", where, w.replicas, want.brokers)
	}
	if r, _ := cmdtest.FlagValue(c.Args, "replicas"); r != want.jobsReplicas {
		t.Errorf("%s: --replicas %q, want %s (one per NATS node)", where, r, want.jobsReplicas)
	}
	// The NATS of nats-values.yaml keeps streams on its volumes and has no
	// memory store: a memory stream cannot be placed there.
	if st, _ := cmdtest.FlagValue(c.Args, "jobs-storage"); st != "file" {
		t.Errorf("%s: --jobs-storage %q, want file (the NATS servers of nats-values.yaml have no memory store)", where, st)
	}
	httpAddr, _ := cmdtest.FlagValue(c.Args, "http")
	host, httpPort := hostPort(t, where+" --http", httpAddr)
	if host != "0.0.0.0" && host != "" {
		t.Errorf("%s: --http %s: the kubelet and the Service reach the pod's address, not loopback", where, httpAddr)
	}
	checkProbe(t, where+" readiness", c, c.ReadinessProbe, "/readyz", httpPort)
	checkProbe(t, where+" liveness", c, c.LivenessProbe, "/healthz", httpPort)
	// /metrics: on its own listener when there is one, else on the HTTP port.
	scrape := httpPort
	if m, ok := cmdtest.FlagValue(c.Args, "metrics-listen"); ok && m != "" {
		h, p := hostPort(t, where+" --metrics-listen", m)
		if h != "0.0.0.0" && h != "" {
			t.Errorf("%s: --metrics-listen %s: Prometheus reaches the pod's address, not loopback", where, m)
		}
		if _, ok := containerPort(c, intstr.FromString("metrics")); !ok {
			t.Errorf("%s: --metrics-listen %s but no container port named metrics", where, m)
		}
		scrape = p
	}
	if w.annotations["prometheus.io/port"] != fmt.Sprint(scrape) || w.annotations["prometheus.io/path"] != "/metrics" {
		t.Errorf("%s: scrape annotations %v, want /metrics on %d", where, w.annotations, scrape)
	}
	delay, _ := cmdtest.FlagValue(c.Args, "shutdown-delay")
	grace, _ := cmdtest.FlagValue(c.Args, "shutdown-grace")
	d, g := seconds(t, where, delay), seconds(t, where, grace)
	if k := podGrace(w); k <= d+g {
		t.Errorf("%s: terminationGracePeriodSeconds %v does not exceed --shutdown-delay %v + --shutdown-grace %v", where, k, d, g)
	}
	// The Service must stop sending requests within the shutdown delay:
	// the probe fails failureThreshold times, periodSeconds apart, each
	// within its timeout, and then the endpoints propagate.
	if p := c.ReadinessProbe; p != nil {
		unready := time.Duration(max(p.PeriodSeconds, 1)*max(p.FailureThreshold, 1)+max(p.TimeoutSeconds, 1)) * time.Second
		if d <= unready+endpointPropagation {
			t.Errorf("%s: --shutdown-delay %v does not exceed the readiness probe's %v (%ds x %d + %ds timeout) plus %v for the endpoints", where, d, unready, p.PeriodSeconds, p.FailureThreshold, p.TimeoutSeconds, endpointPropagation)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("%s: no CPU and memory requests", where)
	}
}

func podGrace(w workload) time.Duration {
	if w.spec.TerminationGracePeriodSeconds == nil {
		return 30 * time.Second // Kubernetes' default
	}
	return time.Duration(*w.spec.TerminationGracePeriodSeconds) * time.Second
}

func checkProbe(t testing.TB, where string, c corev1.Container, p *corev1.Probe, path string, port int32) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: want an HTTP probe of %s", where, path)
		return
	}
	if p.HTTPGet.Path != path {
		t.Errorf("%s: path %s, want %s", where, p.HTTPGet.Path, path)
	}
	if got, ok := containerPort(c, p.HTTPGet.Port); !ok || got != port {
		t.Errorf("%s: port %s is %d, want the listener's %d", where, p.HTTPGet.Port.String(), got, port)
	}
}

func checkAgent(t testing.TB, where string, w workload, c corev1.Container) {
	t.Helper()
	metrics, _ := cmdtest.FlagValue(c.Args, "metrics-listen")
	host, mport := hostPort(t, where+" --metrics-listen", metrics)
	if host != "0.0.0.0" && host != "" {
		t.Errorf("%s: --metrics-listen %s: the kubelet probes the pod's address, not loopback", where, metrics)
	}
	checkProbe(t, where+" agent readiness", c, c.ReadinessProbe, "/readyz", mport)
	if w.annotations["prometheus.io/port"] != fmt.Sprint(mport) {
		t.Errorf("%s: scrape annotation port %q, want the agent's %d", where, w.annotations["prometheus.io/port"], mport)
	}

	// The engine: on localhost, a container of the same pod.
	engineURL, _ := cmdtest.FlagValue(c.Args, "engine-url")
	eng, _ := cmdtest.FlagValue(c.Args, "engine")
	if eng != "vllm-grpc" {
		u, err := url.Parse(engineURL)
		if err != nil || u.Host == "" {
			t.Errorf("%s: --engine-url %q is no URL", where, engineURL)
			return
		}
		engineURL = u.Host
	}
	host, port := hostPort(t, where+" --engine-url", engineURL)
	if host != "127.0.0.1" && host != "localhost" && host != "::1" {
		t.Errorf("%s: --engine-url %s: the agent reaches its engine on localhost", where, engineURL)
	}
	var engine *corev1.Container
	for i, o := range w.spec.Containers {
		if o.Name == c.Name {
			continue
		}
		for _, cp := range o.Ports {
			if cp.ContainerPort == port {
				engine = &w.spec.Containers[i]
			}
		}
	}
	if engine == nil {
		t.Errorf("%s: no other container of the pod declares the engine's port %d", where, port)
		return
	}

	// Shutdown: the agent drains, the engine keeps serving meanwhile, and
	// the pod's grace covers both.
	drain := seconds(t, where, must(cmdtest.FlagValue(c.Args, "drain-timeout")))
	if drain <= 0 {
		t.Errorf("%s: --drain-timeout %v: an agent without one may outlive the grace period", where, drain)
	}
	var stop time.Duration
	if l := engine.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
		stop = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
	} else {
		t.Errorf("%s: engine %s has no preStop sleep: it would stop while its agent drains", where, engine.Name)
	}
	if stop <= drain+agentPullWait {
		t.Errorf("%s: engine preStop %v ends before the agent's drain (%v + %v pull wait)", where, stop, drain, agentPullWait)
	}
	if g := podGrace(w); g <= stop {
		t.Errorf("%s: terminationGracePeriodSeconds %v does not exceed the engine's preStop %v", where, g, stop)
	}
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		t.Errorf("%s: the agent has a preStop hook: it must get SIGTERM at once to drain", where)
	}

	// SGLang prefill: decode engines dial the bootstrap server at the
	// pod's address.
	role, _ := cmdtest.FlagValue(c.Args, "role")
	if role == "prefill" && eng == "sglang" {
		bh, _ := cmdtest.FlagValue(c.Args, "bootstrap-host")
		ok := false
		if name, isVar := strings.CutPrefix(bh, "$("); isVar {
			name = strings.TrimSuffix(name, ")")
			for _, e := range c.Env {
				if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
					ok = true
				}
			}
		}
		if !ok {
			t.Errorf("%s: --bootstrap-host %q: want the pod IP (an env var from status.podIP)", where, bh)
		}
		bp, _ := cmdtest.FlagValue(c.Args, "bootstrap-port")
		declared := false
		for _, cp := range engine.Ports {
			if fmt.Sprint(cp.ContainerPort) == bp {
				declared = true
			}
		}
		if !declared {
			t.Errorf("%s: --bootstrap-port %s is no port of the engine container", where, bp)
		}
		if v, _ := cmdtest.FlagValue(append(slices.Clone(engine.Command), engine.Args...), "disaggregation-bootstrap-port"); v != bp {
			t.Errorf("%s: engine --disaggregation-bootstrap-port %q, agent --bootstrap-port %s", where, v, bp)
		}
	}
}

func must(v string, _ bool) string { return v }

// agentOf returns the agent container of a workload.
func agentOf(w workload) (corev1.Container, bool) {
	for _, c := range w.spec.Containers {
		if binaryOf(c.Image) == "worker-agent" {
			return c, true
		}
	}
	return corev1.Container{}, false
}

// checkScaledObject: the trigger is KEDA's prometheus scaler at a fully
// qualified address, on the brokers' series of the model and pool the
// target's agents serve, in the release's namespace, with metrics the
// broker has, one replica per at most the agent's slots.
func checkScaledObject(t testing.TB, where string, so *ScaledObject, byName map[string]workload, want expect) {
	t.Helper()
	ref := so.Spec.ScaleTargetRef
	w, ok := byName[ref.Kind+"/"+ref.Name]
	if !ok || ref.APIVersion != "apps/v1" {
		t.Errorf("%s: scales %s %s/%s, which the chart does not render", where, ref.APIVersion, ref.Kind, ref.Name)
		return
	}
	if w.replicas != nil {
		t.Errorf("%s: %s sets replicas too: KEDA and helm upgrades would fight over them", where, w.name)
	}
	a, ok := agentOf(w)
	if !ok {
		t.Errorf("%s: %s has no agent", where, w.name)
		return
	}
	if len(so.Spec.Triggers) != 1 {
		t.Errorf("%s: %d triggers, want 1", where, len(so.Spec.Triggers))
		return
	}
	tr := so.Spec.Triggers[0]
	m := tr.Metadata
	if tr.Type != "prometheus" {
		t.Errorf("%s: trigger %s, want prometheus", where, tr.Type)
	}
	if u, err := url.Parse(m["serverAddress"]); err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.Contains(u.Hostname(), ".") {
		t.Errorf("%s: serverAddress %q: want an http(s) URL with a fully qualified host (KEDA resolves from its own namespace)", where, m["serverAddress"])
	}
	model, _ := cmdtest.FlagValue(a.Args, "model")
	role, _ := cmdtest.FlagValue(a.Args, "role")
	q := m["query"]
	sels := metricSelector.FindAllStringSubmatch(q, -1)
	if len(sels) == 0 {
		t.Errorf("%s: query %q reads no switchyard series", where, q)
	}
	known := brokerMetricNames(t)
	for _, sel := range sels {
		name, labels := sel[1], sel[2]
		if !known[name] {
			t.Errorf("%s: query reads %s, which the broker does not export", where, name)
		}
		for _, l := range []string{`model="` + model + `"`, `pool="` + role + `"`, `namespace="` + want.namespace + `"`} {
			if !strings.Contains(labels, l) {
				t.Errorf("%s: %s{%s}: want %s (the target's agents and the release's brokers)", where, name, labels, l)
			}
		}
	}
	slots, err := strconv.Atoi(must(cmdtest.FlagValue(a.Args, "slots")))
	if err != nil {
		t.Errorf("%s: agent --slots: %v", where, err)
	}
	if th, err := strconv.Atoi(m["threshold"]); err != nil || th < 1 || th > slots {
		t.Errorf("%s: threshold %q: want a number of jobs per replica from 1 to the agent's %d slots", where, m["threshold"], slots)
	}
	if at, err := strconv.Atoi(m["activationThreshold"]); err != nil || at < 0 {
		t.Errorf("%s: activationThreshold %q is no count", where, m["activationThreshold"])
	}
	if so.Spec.MaxReplicaCount == nil || so.Spec.MinReplicaCount == nil || *so.Spec.MaxReplicaCount < *so.Spec.MinReplicaCount {
		t.Errorf("%s: replicas %v..%v", where, so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount)
	}
}

// metricSelector finds name{labels} of the Switchyard series in PromQL.
var metricSelector = regexp.MustCompile(`\b(switchyard_[a-z_]+)\{([^}]*)\}`)

// brokerMetricNames are the names of the broker's own metrics, from the
// descriptions of its collectors.
func brokerMetricNames(t testing.TB) map[string]bool {
	t.Helper()
	var rec describer
	if err := broker.NewMetrics().Register(&rec); err != nil {
		t.Fatal(err)
	}
	rec.cs = append(rec.cs, (&broker.Broker{}).Collector())
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range rec.cs {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fq.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("the broker describes %d metrics", len(names))
	}
	return names
}

// describer is a prometheus.Registerer that keeps what is registered.
type describer struct{ cs []prometheus.Collector }

func (d *describer) Register(c prometheus.Collector) error   { d.cs = append(d.cs, c); return nil }
func (d *describer) MustRegister(cs ...prometheus.Collector) { d.cs = append(d.cs, cs...) }
func (d *describer) Unregister(prometheus.Collector) bool    { return false }
