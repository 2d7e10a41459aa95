package helmtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

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
		"nats.monitoringEndpoint=n1:8222",
		"broker.replicas=5",
		"broker.metrics.serviceMonitor.enabled=true",
		"agent.volumeMounts[0].name=hf-cache",
		"agent.volumeMounts[0].mountPath=/etc/nats-ca",
		"agent.volumeMounts[0].readOnly=true",
	)
	want := defaults
	want.natsURL, want.secret, want.brokers, want.monitoringURL = "nats://n1:4222,nats://n2:4222", "other-secret", 5, "n1:8222"
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
		if s, ok := o.obj.(*corev1.Service); ok && s.Spec.ClusterIP == corev1.ClusterIPNone {
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
		{"KEDA on another pool's consumer", func(objs []object) {
			for _, o := range objs {
				if so, ok := o.obj.(*ScaledObject); ok && strings.HasSuffix(so.Spec.ScaleTargetRef.Name, "prefill") {
					so.Spec.Triggers[0].Metadata["consumer"] = strings.Replace(so.Spec.Triggers[0].Metadata["consumer"], "prefill", "decode", 1)
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

	run := func(t *testing.T, name string, c *corev1.Container, fn func(context.Context, []string, func(string) string, io.Writer, io.Writer) error, rewrite func([]string) []string) {
		env := podEnv(*c)
		args := rewrite(expand(c.Args, env))
		args = setFlag(args, "nats-url", s.ClientURL())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- fn(ctx, args, func(k string) string { return env[k] }, io.Discard, io.Discard) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
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
