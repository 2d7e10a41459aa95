package helmtest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// valueSets are the renderings the tests check: the default values and
// every example values file.
func valueSets(t *testing.T) map[string][]string {
	t.Helper()
	sets := map[string][]string{"default": nil}
	examples, err := filepath.Glob(filepath.Join(chartDir(t), "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(examples) < 3 {
		t.Fatalf("examples/ has %d values files, want the vLLM, vLLM PD and SGLang PD ones", len(examples))
	}
	for _, e := range examples {
		sets[strings.TrimSuffix(filepath.Base(e), ".yaml")] = []string{e}
	}
	return sets
}

func TestLint(t *testing.T) {
	chart := chartDir(t)
	for name, files := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chart, "--kube-version", kubeVersion}
			for _, f := range files {
				args = append(args, "-f", f)
			}
			if out, err := helm(t, args...); err != nil {
				t.Fatal(err)
			} else {
				t.Log(strings.TrimSpace(out))
			}
		})
	}
}

func TestTemplate(t *testing.T) {
	chart := chartDir(t)
	flags := commandFlags(t)
	for name, files := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			objs := render(t, chart, files)
			checkObjects(t, objs, flags, defaults)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.kind]++
			}
			t.Logf("rendered %v", kinds)
			if kinds["Deployment"] == 0 || kinds["Service"] == 0 || kinds["PodDisruptionBudget"] == 0 {
				t.Errorf("want the broker's Deployment, Service and PodDisruptionBudget, have %v", kinds)
			}
			if name == "default" {
				return
			}
			// Every example is a fleet: agents, each beside its engine,
			// and the roles its name promises.
			roles := map[string]bool{}
			for _, w := range workloads(objs) {
				if a, ok := agentOf(w); ok {
					r, _ := cmdtest.FlagValue(a.Args, "role")
					roles[r] = true
				}
			}
			want := []string{"regular"}
			if strings.Contains(name, "pd") {
				want = []string{"prefill", "decode"}
			}
			for _, r := range want {
				if !roles[r] {
					t.Errorf("no agent with --role %s (roles %v)", r, roles)
				}
			}
		})
	}
}

// TestValuesReachTheObjects renders with other values for what a user
// sets most: images, NATS, the broker's count and the optional objects.
func TestValuesReachTheObjects(t *testing.T) {
	chart := chartDir(t)
	example := filepath.Join(chart, "examples", "vllm-regular.yaml")
	objs := render(t, chart, []string{example},
		"image.registry=registry.example.com/ai",
		"image.tag=9.9.9",
		"agent.image.tag=9.9.8",
		"nats.url=nats://n1:4222\\,nats://n2:4222",
		"nats.credentialsSecret=other-secret",
		"keda.brokerNamespace=fleet",
		"broker.replicas=5",
		"broker.metrics.serviceMonitor.enabled=true",
		"agent.volumeMounts[0].name=cache",
		"agent.volumeMounts[0].mountPath=/etc/nats-ca",
		"agent.volumeMounts[0].readOnly=true",
	)
	want := defaults
	want.natsURL, want.secret, want.brokers, want.namespace = "nats://n1:4222,nats://n2:4222", "other-secret", 5, "fleet"
	checkObjects(t, objs, commandFlags(t), want)
	images := map[string]string{}
	monitors := 0
	for _, o := range objs {
		if _, ok := o.obj.(*ServiceMonitor); ok {
			monitors++
		}
	}
	for _, w := range workloads(objs) {
		for _, c := range w.spec.Containers {
			if b := binaryOf(c.Image); b != "" {
				images[b] = c.Image
			}
		}
	}
	if images["broker"] != "registry.example.com/ai/switchyard/broker:9.9.9" || images["worker-agent"] != "registry.example.com/ai/switchyard/worker-agent:9.9.8" {
		t.Errorf("images %v: want them from the values", images)
	}
	if monitors != 1 {
		t.Errorf("%d ServiceMonitors, want 1", monitors)
	}
	if a := agentIn(objs, "regular"); len(a.VolumeMounts) != 1 || a.VolumeMounts[0].MountPath != "/etc/nats-ca" || !a.VolumeMounts[0].ReadOnly {
		t.Errorf("agent mounts %+v, want agent.volumeMounts", a.VolumeMounts)
	}

	// A pool as a StatefulSet, with its governing Service (a Deployment's
	// strategy does not fit a StatefulSet: strict decoding refuses it).
	objs = render(t, chart, []string{example}, "pools[0].kind=StatefulSet", "pools[0].strategy=null")
	checkObjects(t, objs, commandFlags(t), defaults)
	sts := 0
	for _, w := range workloads(objs) {
		if w.kind == "StatefulSet" {
			sts++
		}
	}
	headless := 0
	for _, o := range objs {
		// The brokers' metrics Service is headless too; count the pools'.
		if s, ok := o.obj.(*corev1.Service); ok && s.Spec.ClusterIP == corev1.ClusterIPNone && s.Spec.Selector["app.kubernetes.io/component"] != "broker" {
			headless++
		}
	}
	if sts != 1 || headless != 1 {
		t.Errorf("kind StatefulSet: %d StatefulSets and %d headless Services, want 1 and 1", sts, headless)
	}

	// As shipped, the images are the chart's appVersion.
	chartYAML, err := os.ReadFile(filepath.Join(chart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workloads(render(t, chart, nil)) {
		for _, c := range w.spec.Containers {
			if binaryOf(c.Image) != "" && !strings.Contains(string(chartYAML), fmt.Sprintf("appVersion: %q", c.Image[strings.LastIndex(c.Image, ":")+1:])) {
				t.Errorf("image %s: its tag is not the chart's appVersion", c.Image)
			}
		}
	}
}

// TestChartRefusesBadValues: values that would break a drain or a pool
// stop the rendering with a message that names them.
func TestChartRefusesBadValues(t *testing.T) {
	chart := chartDir(t)
	example := filepath.Join(chart, "examples", "vllm-regular.yaml")
	for _, tt := range []struct {
		name string
		sets []string
		want string
	}{
		{"grace under the engine's stop delay", []string{"agent.terminationGracePeriodSeconds=20"}, "terminationGracePeriodSeconds"},
		{"engine stops before its agent drained", []string{"agent.engineStopDelaySeconds=10"}, "engineStopDelaySeconds"},
		{"broker grace under its drain", []string{"broker.terminationGracePeriodSeconds=30"}, "shutdownDelaySeconds"},
		{"unknown role", []string{"pools[0].role=both"}, "role"},
		{"no model", []string{"pools[0].model=null"}, "model"},
		{"misspelled pool field", []string{"pools[0].enginePrt=8000"}, "enginePrt"},
		{"unknown engine adapter", []string{"pools[0].engine=trtllm"}, "engine"},
		{"NATS URL without a scheme", []string{"nats.url=nats:4222"}, "url"},
		{"no credentials Secret", []string{"nats.credentialsSecret="}, "credentialsSecret"},
		// Typos fail: every object of values that is ours is closed.
		{"misspelled top-level key", []string{"brokr.replicas=3"}, "brokr"},
		{"misspelled broker field", []string{"broker.replicsa=3"}, "replicsa"},
		{"misspelled Service field", []string{"broker.service.tpye=LoadBalancer"}, "tpye"},
		{"misspelled ServiceMonitor field", []string{"broker.metrics.serviceMonitor.enabeld=true"}, "enabeld"},
		{"misspelled KEDA field", []string{"pools[0].keda.maxReplica=3"}, "maxReplica"},
		{"misspelled chart KEDA field", []string{"keda.cooldown=0"}, "cooldown"},
		{"misspelled Go runtime field", []string{"goRuntime.gomemlimit=1"}, "gomemlimit"},
		{"unknown kind", []string{"pools[0].kind=DaemonSet"}, "kind"},
		// Names cannot collide.
		{"pool named broker", []string{"pools[0].name=broker"}, "broker"},
		{"two pools of one name", []string{"pools[1].name=llama", "pools[1].model=m", "pools[1].enginePort=8000", "pools[1].containers[0].name=e", "pools[1].containers[0].image=e"}, "llama"},
		{"pools whose names meet after truncation", []string{
			"pools[0].name=" + strings.Repeat("a", 50) + "-one",
			"pools[1].name=" + strings.Repeat("a", 50) + "-two", "pools[1].model=m", "pools[1].enginePort=8000", "pools[1].containers[0].name=e", "pools[1].containers[0].image=e",
		}, "would be named"},
		// Timing and addresses.
		{"shutdown delay within the probe's reaction", []string{"broker.shutdownDelaySeconds=5"}, "shutdownDelaySeconds"},
		{"KEDA at a short name", []string{"keda.serverAddress=http://prometheus:9090"}, "fully qualified"},
		{"KEDA without Prometheus", []string{"keda.serverAddress="}, "serverAddress"},
		{"pod with containers of its own", []string{"pools[0].pod.containers[0].name=x"}, "pod.containers"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"template", "rel", chart, "--kube-version", kubeVersion, "-f", example}
			for _, s := range tt.sets {
				args = append(args, "--set", s)
			}
			_, err := helm(t, args...)
			if err == nil {
				t.Fatalf("rendered; want an error naming %q", tt.want)
			}
			// What helm said, without the command line that helm() puts first.
			_, said, _ := strings.Cut(err.Error(), "\n")
			if !strings.Contains(said, tt.want) {
				t.Fatalf("err %v, want one naming %q", err, tt.want)
			}
			for _, l := range strings.Split(said, "\n") {
				if strings.Contains(l, tt.want) {
					t.Logf("refused: %s", strings.TrimSpace(l))
					break
				}
			}
		})
	}
}

// TestChecksCatchMistakes breaks rendered objects in the ways the checks
// exist for, so a green run means something.
func TestChecksCatchMistakes(t *testing.T) {
	chart := chartDir(t)
	flags := commandFlags(t)
	files := []string{filepath.Join(chart, "examples", "sglang-pd.yaml")}
	for _, tt := range []struct {
		name   string
		break_ func(objs []object)
	}{
		{"unknown agent flag", func(objs []object) {
			agentIn(objs, "prefill").Args = append(agentIn(objs, "prefill").Args, "--drain", "5s")
		}},
		{"unknown broker flag", func(objs []object) { brokerIn(objs).Args[0] = "--nats-urls" }},
		{"broker readiness on another path", func(objs []object) { brokerIn(objs).ReadinessProbe.HTTPGet.Path = "/ready" }},
		{"agent readiness on the engine's port", func(objs []object) {
			agentIn(objs, "decode").ReadinessProbe.HTTPGet.Port.StrVal = "http"
		}},
		{"engine not on localhost", func(objs []object) {
			a := agentIn(objs, "decode")
			a.Args = setFlag(a.Args, "engine-url", "http://qwen-decode:30000")
		}},
		{"literal NATS password", func(objs []object) {
			a := agentIn(objs, "decode")
			a.Env = append(a.Env, corev1.EnvVar{Name: "SWITCHYARD_NATS_TOKEN", Value: "hunter2"})
		}},
		{"password on the command line", func(objs []object) {
			b := brokerIn(objs)
			b.Args = append(b.Args, "--nats-password", "hunter2")
		}},
		{"drain longer than the engine's stop delay", func(objs []object) {
			a := agentIn(objs, "prefill")
			a.Args = setFlag(a.Args, "drain-timeout", "10m")
		}},
		{"SGLang bootstrap on loopback", func(objs []object) {
			a := agentIn(objs, "prefill")
			a.Args = setFlag(a.Args, "bootstrap-host", "127.0.0.1")
		}},
		{"KEDA on another pool's series", func(objs []object) {
			scalerOf(objs, "prefill").Triggers[0].Metadata["query"] = strings.ReplaceAll(scalerOf(objs, "prefill").Triggers[0].Metadata["query"], `pool="prefill"`, `pool="decode"`)
		}},
		{"KEDA on another namespace's brokers", func(objs []object) {
			scalerOf(objs, "decode").Triggers[0].Metadata["query"] = strings.ReplaceAll(scalerOf(objs, "decode").Triggers[0].Metadata["query"], `namespace="sy"`, `namespace="default"`)
		}},
		{"KEDA on a metric the broker lacks", func(objs []object) {
			scalerOf(objs, "decode").Triggers[0].Metadata["query"] = strings.ReplaceAll(scalerOf(objs, "decode").Triggers[0].Metadata["query"], "switchyard_pool_demand_jobs", "switchyard_pool_demand")
		}},
		{"KEDA at a short name", func(objs []object) {
			scalerOf(objs, "decode").Triggers[0].Metadata["serverAddress"] = "http://prometheus:9090"
		}},
		{"KEDA wants more jobs per replica than slots", func(objs []object) {
			scalerOf(objs, "prefill").Triggers[0].Metadata["threshold"] = "1000"
		}},
		{"KEDA on the NATS backlog", func(objs []object) { scalerOf(objs, "decode").Triggers[0].Type = "nats-jetstream" }},
		{"readiness too slow for the shutdown delay", func(objs []object) { brokerIn(objs).ReadinessProbe.FailureThreshold = 5 }},
		{"GOMEMLIMIT at the whole limit", func(objs []object) {
			b := brokerIn(objs)
			for i := range b.Env {
				if r := b.Env[i].ValueFrom; r != nil && r.ResourceFieldRef != nil {
					r.ResourceFieldRef.Divisor = resource.MustParse("1Mi")
				}
			}
		}},
		{"no GOMEMLIMIT", func(objs []object) {
			a := agentIn(objs, "decode")
			a.Env = slices.DeleteFunc(a.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" })
		}},
		{"broker may escalate privileges", func(objs []object) {
			yes := true
			brokerIn(objs).SecurityContext.AllowPrivilegeEscalation = &yes
		}},
		{"agent keeps its capabilities", func(objs []object) { agentIn(objs, "prefill").SecurityContext.Capabilities = nil }},
		{"engine as root", func(objs []object) {
			for _, w := range workloads(objs) {
				if _, ok := agentOf(w); ok {
					root := int64(0)
					w.spec.Containers[0].SecurityContext.RunAsUser = &root
				}
			}
		}},
		{"engine capability the pool did not declare", func(objs []object) {
			for _, w := range workloads(objs) {
				if _, ok := agentOf(w); ok {
					c := w.spec.Containers[0].SecurityContext.Capabilities
					c.Add = append(c.Add, "SYS_ADMIN")
				}
			}
		}},
		{"hostPath volume", func(objs []object) {
			for _, o := range objs {
				if d, ok := o.obj.(*appsv1.Deployment); ok && strings.HasSuffix(d.Name, "-broker") {
					d.Spec.Template.Spec.Volumes = append(d.Spec.Template.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run"}}})
				}
			}
		}},
		{"mount of no volume", func(objs []object) {
			a := agentIn(objs, "decode")
			a.VolumeMounts = append(a.VolumeMounts, corev1.VolumeMount{Name: "nats-ca", MountPath: "/ca"})
		}},
		{"jobs stream on one node", func(objs []object) {
			b := brokerIn(objs)
			b.Args = setFlag(b.Args, "replicas", "1")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, chart, files)
			tt.break_(objs)
			rec := &cmdtest.Recorder{TB: t}
			checkObjects(rec, objs, flags, defaults)
			if len(rec.Errs) == 0 {
				t.Errorf("no check failed")
			}
			t.Logf("caught: %s", strings.Join(rec.Errs, "; "))
		})
	}
}

// scalerOf returns the spec of the ScaledObject of the pool of a role.
func scalerOf(objs []object, role string) *ScaledObjectSpec {
	for _, o := range objs {
		if so, ok := o.obj.(*ScaledObject); ok && strings.HasSuffix(so.Spec.ScaleTargetRef.Name, role) {
			return &so.Spec
		}
	}
	panic("no ScaledObject for " + role)
}

func brokerIn(objs []object) *corev1.Container {
	for _, w := range workloads(objs) {
		for i := range w.spec.Containers {
			if binaryOf(w.spec.Containers[i].Image) == "broker" {
				return &w.spec.Containers[i]
			}
		}
	}
	panic("no broker rendered")
}

func agentIn(objs []object, role string) *corev1.Container {
	for _, w := range workloads(objs) {
		for i := range w.spec.Containers {
			c := &w.spec.Containers[i]
			if r, _ := cmdtest.FlagValue(c.Args, "role"); binaryOf(c.Image) == "worker-agent" && r == role {
				return c
			}
		}
	}
	panic("no agent of role " + role)
}

// podEnv is the environment Kubernetes would give c, with Secrets and
// the downward API filled in with stand-ins.
func podEnv(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret-" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = "pod-0"
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = "127.0.0.1"
		}
	}
	return env
}

// expand replaces $(VAR) in args as the kubelet does.
func expand(args []string, env map[string]string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		out[i] = a
	}
	return out
}

// TestProbesAreServed runs the broker and an agent in-process with the
// command lines and environment the chart renders (addresses moved to
// loopback, NATS to an embedded test server), and asks each probe's path
// on the port the probe names. The broker requires API keys, which the
// kubelet's probes do not send.
func TestProbesAreServed(t *testing.T) {
	chart := chartDir(t)
	objs := render(t, chart, []string{filepath.Join(chart, "examples", "vllm-regular.yaml")},
		"broker.extraEnv[0].name=SWITCHYARD_API_KEY",
		"broker.extraEnv[0].valueFrom.secretKeyRef.name=api-keys",
		"broker.extraEnv[0].valueFrom.secretKeyRef.key=key")
	s := natstest.RunJetStream(t)
	run := func(t *testing.T, name string, c *corev1.Container, fn command, rewrite func([]string) []string) {
		runContainer(t, name, c, fn, s.ClientURL(), nil, rewrite)
	}
	// probeURL points a probe at the loopback port that stands in for the
	// container port it names.
	probeURL := func(c *corev1.Container, p *corev1.Probe, ports map[int32]int) string {
		port, ok := containerPort(*c, p.HTTPGet.Port)
		if !ok {
			t.Fatalf("probe port %s is no port of %s", p.HTTPGet.Port.String(), c.Name)
		}
		return fmt.Sprintf("http://127.0.0.1:%d%s", ports[port], p.HTTPGet.Path)
	}

	b := brokerIn(objs)
	httpPort, grpcPort := natstest.FreePort(t), natstest.FreePort(t)
	_, hp := hostPort(t, "broker --http", must(cmdtest.FlagValue(b.Args, "http")))
	run(t, "broker", b, brokercmd.Run, func(a []string) []string {
		a = setFlag(a, "http", fmt.Sprintf("127.0.0.1:%d", httpPort))
		a = setFlag(a, "grpc", fmt.Sprintf("127.0.0.1:%d", grpcPort))
		a = setFlag(a, "replicas", "1") // one test server
		return setFlag(a, "shutdown-delay", "0s")
	})
	bports := map[int32]int{hp: httpPort}
	testwait.Status(t, nil, probeURL(b, b.ReadinessProbe, bports), http.StatusOK)
	testwait.Status(t, nil, probeURL(b, b.LivenessProbe, bports), http.StatusOK)
	// The key is in force: the API refuses a request without it.
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/v1/models", httpPort), http.StatusUnauthorized)

	a := agentIn(objs, "regular")
	metricsPort := natstest.FreePort(t)
	_, mp := hostPort(t, "agent --metrics-listen", must(cmdtest.FlagValue(a.Args, "metrics-listen")))
	run(t, "agent", a, agentcmd.Run, func(args []string) []string {
		args = setFlag(args, "metrics-listen", fmt.Sprintf("127.0.0.1:%d", metricsPort))
		return setFlag(args, "engine", "sim") // the in-process simulator stands in for vLLM
	})
	testwait.Status(t, nil, probeURL(a, a.ReadinessProbe, map[int32]int{mp: metricsPort}), http.StatusOK)
}

// command is the run function of a Switchyard command.
type command func(context.Context, []string, func(string) string, io.Writer, io.Writer) error

// runContainer runs a Switchyard command in-process as the container c
// would run it: its arguments with $(VAR) expanded, --nats-url set to
// natsURL, then rewrite; its environment as podEnv gives it, with the
// variables of env over it. The command stops at the test's cleanup, and
// an error it returns fails the test.
func runContainer(t *testing.T, name string, c *corev1.Container, fn command, natsURL string, env map[string]string, rewrite func([]string) []string) {
	t.Helper()
	e := podEnv(*c)
	maps.Copy(e, env)
	args := rewrite(expand(c.Args, e))
	args = setFlag(args, "nats-url", natsURL)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx, args, func(k string) string { return e[k] }, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
}

// copyDir copies the regular files under src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestOwnEngineChart: a user's own chart that depends on this one adds
// the agent to its engine Deployment with the named templates, as
// docs/kubernetes.md shows, and the result passes the same checks.
func TestOwnEngineChart(t *testing.T) {
	dir := t.TempDir()
	copyDir(t, chartDir(t), filepath.Join(dir, "switchyard"))
	copyDir(t, filepath.Join("testdata", "mychart"), filepath.Join(dir, "mychart"))
	mychart := filepath.Join(dir, "mychart")
	if _, err := helm(t, "dependency", "update", mychart); err != nil {
		t.Fatal(err)
	}
	if _, err := helm(t, "lint", "--strict", mychart, "--kube-version", kubeVersion); err != nil {
		t.Fatal(err)
	}
	objs := render(t, mychart, nil)
	checkObjects(t, objs, commandFlags(t), defaults)
	found := false
	for _, w := range workloads(objs) {
		if _, ok := agentOf(w); ok && w.name == "rel-engine" {
			found = true
		}
	}
	if !found {
		t.Error("the user's Deployment rel-engine has no agent")
	}
}

// TestZeroRendersZero: a value of 0 is a value, not a missing one.
func TestZeroRendersZero(t *testing.T) {
	chart := chartDir(t)
	example := filepath.Join(chart, "examples", "vllm-regular.yaml")
	objs := render(t, chart, []string{example},
		"pools[0].keda.enabled=false", "pools[0].replicas=0", "broker.replicas=0")
	want := defaults
	want.brokers = 0
	checkObjects(t, objs, commandFlags(t), want)
	for _, w := range workloads(objs) {
		if w.replicas == nil || *w.replicas != 0 {
			t.Errorf("%s %s: replicas %v, want 0", w.kind, w.name, w.replicas)
		}
	}

	objs = render(t, chart, []string{example},
		"keda.cooldownPeriod=0", "pools[0].keda.minReplicas=0", "pools[0].keda.activationThreshold=0")
	checkObjects(t, objs, commandFlags(t), defaults)
	so := scalerOf(objs, "llama")
	if so.CooldownPeriod == nil || *so.CooldownPeriod != 0 || so.MinReplicaCount == nil || *so.MinReplicaCount != 0 {
		t.Errorf("cooldownPeriod %v, minReplicaCount %v: want 0 and 0", so.CooldownPeriod, so.MinReplicaCount)
	}
	if a := so.Triggers[0].Metadata["activationThreshold"]; a != "0" {
		t.Errorf("activationThreshold %q, want 0", a)
	}
	// A pool's own 0 wins over the chart's KEDA defaults too.
	objs = render(t, chart, []string{example}, "pools[0].keda.cooldownPeriod=0")
	if so := scalerOf(objs, "llama"); so.CooldownPeriod == nil || *so.CooldownPeriod != 0 {
		t.Errorf("a pool's cooldownPeriod 0: %v", so.CooldownPeriod)
	}
}

// TestMetricsListener: with broker.metricsPort the broker serves /metrics
// on a listener of its own, which needs no API key, and Prometheus is
// pointed at it through a Service apart from the API's.
func TestMetricsListener(t *testing.T) {
	if !commandFlags(t)["broker"]["metrics-listen"] {
		t.Skip("the broker has no --metrics-listen: broker.metricsPort must stay 0")
	}
	chart := chartDir(t)
	objs := render(t, chart, []string{filepath.Join(chart, "examples", "vllm-regular.yaml")},
		"broker.metricsPort=9091", "broker.metrics.serviceMonitor.enabled=true",
		"broker.extraEnv[0].name=SWITCHYARD_API_KEY",
		"broker.extraEnv[0].valueFrom.secretKeyRef.name=api-keys",
		"broker.extraEnv[0].valueFrom.secretKeyRef.key=key")
	checkObjects(t, objs, commandFlags(t), defaults)
	var metricsSvc *corev1.Service
	var sm *ServiceMonitor
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *corev1.Service:
			if strings.HasSuffix(v.Name, "-metrics") {
				metricsSvc = v
			}
		case *ServiceMonitor:
			sm = v
		}
	}
	if metricsSvc == nil || len(metricsSvc.Spec.Ports) != 1 || metricsSvc.Spec.Ports[0].Port != 9091 || metricsSvc.Spec.Ports[0].Name != "metrics" {
		t.Fatalf("metrics Service %+v: want port metrics 9091", metricsSvc)
	}
	if sm == nil || sm.Spec.Endpoints[0].Port != "metrics" {
		t.Fatalf("ServiceMonitor %+v: want the metrics port", sm)
	}
	for k, v := range sm.Spec.Selector.MatchLabels {
		if metricsSvc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the metrics Service lacks", k, v)
		}
	}
	if sm.Spec.Selector.MatchLabels["switchyard.ai/metrics"] != "true" {
		t.Errorf("the ServiceMonitor selects %v, the API Service too", sm.Spec.Selector.MatchLabels)
	}

	s := natstest.RunJetStream(t)
	b := brokerIn(objs)
	httpPort, metricsPort := natstest.FreePort(t), natstest.FreePort(t)
	runContainer(t, "broker", b, brokercmd.Run, s.ClientURL(), nil, func(a []string) []string {
		a = setFlag(a, "http", fmt.Sprintf("127.0.0.1:%d", httpPort))
		a = setFlag(a, "grpc", "")
		a = setFlag(a, "metrics-listen", fmt.Sprintf("127.0.0.1:%d", metricsPort))
		a = setFlag(a, "replicas", "1")
		return setFlag(a, "shutdown-delay", "0s")
	})
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), http.StatusOK)
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort), http.StatusUnauthorized)
}
