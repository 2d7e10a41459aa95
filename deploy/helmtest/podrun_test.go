//go:build unix

package helmtest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/switchyard-ai/switchyard/internal/natstest"
)

// This file turns rendered workloads into pods on loopback: what a cluster
// gives a pod (its name, its IP, DNS names for Services and StatefulSet
// pods, Secrets, volumes) is given by the test, and nothing else of the
// rendered pod is changed. Every pod shares 127.0.0.1, so each container
// port of a pod is a random loopback port of its own, and an address that
// names a pod port (a listen address, a URL of the pod's own localhost, a
// Service, a pod's DNS name) is rewritten to it.

// testNamespace is the namespace both charts are rendered into.
const testNamespace = "sy"

// runPod is one pod of a rendered workload.
type runPod struct {
	name     string
	workload string
	labels   map[string]string
	spec     corev1.PodSpec
	ports    map[int32]int     // container port -> loopback port
	mounts   map[string]string // volume name -> the directory standing in for it
}

// port returns the loopback port standing in for the pod's port p.
func (p *runPod) port(t testing.TB, cp int32) int {
	if lp, ok := p.ports[cp]; ok {
		return lp
	}
	lp := natstest.FreePort(t)
	p.ports[cp] = lp
	return lp
}

// namedPort resolves a port name or number of one of the pod's containers.
func (p *runPod) namedPort(ip intstr.IntOrString) (int32, bool) {
	if ip.Type == intstr.Int {
		return ip.IntVal, true
	}
	for _, c := range p.spec.Containers {
		if n, ok := containerPort(c, ip); ok {
			return n, true
		}
	}
	return 0, false
}

// cluster is what the test stands in for: the rendered objects of both
// charts, their pods, and the Secret they read.
type cluster struct {
	t          *testing.T
	objs       []object
	pods       []*runPod
	secrets    map[string]map[string]string // Secret name -> key -> value
	configMaps map[string]map[string]string
}

func newCluster(t *testing.T, secrets map[string]map[string]string, objs ...[]object) *cluster {
	c := &cluster{t: t, secrets: secrets, configMaps: map[string]map[string]string{}}
	for _, o := range objs {
		c.objs = append(c.objs, o...)
	}
	for _, o := range c.objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok {
			c.configMaps[cm.Name] = cm.Data
		}
	}
	return c
}

// testSecrets returns a Secret for every secretKeyRef of the rendered
// containers, each key a random password, as an operator creates them.
func testSecrets(objs ...[]object) map[string]map[string]string {
	s := map[string]map[string]string{}
	for _, os := range objs {
		for _, w := range workloads(os) {
			for _, c := range w.spec.Containers {
				for _, e := range c.Env {
					if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
						continue
					}
					ref := e.ValueFrom.SecretKeyRef
					if s[ref.Name] == nil {
						s[ref.Name] = map[string]string{}
					}
					if _, ok := s[ref.Name][ref.Key]; !ok {
						s[ref.Name][ref.Key] = randomPassword()
					}
				}
			}
		}
	}
	return s
}

// randomPassword is a password as an operator makes one.
func randomPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// podsOf creates the pods of a workload: its replicas, named as the
// controller names them (StatefulSet: name-0, name-1; Deployment: a
// stand-in for the template hash and a suffix).
func (c *cluster) podsOf(o object) []*runPod {
	var (
		name     string
		replicas *int32
		tmpl     corev1.PodTemplateSpec
		ordinal  bool
	)
	switch w := o.obj.(type) {
	case *appsv1.Deployment:
		name, replicas, tmpl = w.Name, w.Spec.Replicas, w.Spec.Template
	case *appsv1.StatefulSet:
		name, replicas, tmpl, ordinal = w.Name, w.Spec.Replicas, w.Spec.Template, true
	default:
		c.t.Fatalf("%s %s is no workload", o.kind, o.name)
	}
	n := 1 // the API server's default
	if replicas != nil {
		n = int(*replicas)
	}
	var out []*runPod
	for i := range n {
		pn := fmt.Sprintf("%s-5d4f7c9b8-p%d", name, i)
		if ordinal {
			pn = fmt.Sprintf("%s-%d", name, i)
		}
		p := &runPod{name: pn, workload: o.kind + "/" + name, labels: tmpl.Labels, spec: *tmpl.Spec.DeepCopy(),
			ports: map[int32]int{}, mounts: map[string]string{}}
		c.pods = append(c.pods, p)
		out = append(out, p)
	}
	return out
}

// workload returns the rendered workload of kind and name.
func (c *cluster) workload(kind, name string) object {
	for _, o := range c.objs {
		if o.kind == kind && o.name == name {
			return o
		}
	}
	c.t.Fatalf("no %s %s rendered", kind, name)
	return object{}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandVars replaces $(VAR) with env's VAR as the kubelet does: an
// unknown reference stays as written, $$ escapes.
func expandVars(s string, env map[string]string) string {
	s = strings.ReplaceAll(s, "$$", "\x00")
	s = varRef.ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
	return strings.ReplaceAll(s, "\x00", "$")
}

// env resolves a container's environment as the kubelet would: values
// with earlier variables expanded, Secrets from the test's, the downward
// API from the pod, resource fields from the container's resources.
func (c *cluster) env(p *runPod, ct corev1.Container) map[string]string {
	t := c.t
	t.Helper()
	env := map[string]string{}
	for _, from := range ct.EnvFrom {
		var data map[string]string
		switch {
		case from.SecretRef != nil:
			data = c.secrets[from.SecretRef.Name]
		case from.ConfigMapRef != nil:
			data = c.configMaps[from.ConfigMapRef.Name]
		}
		if data == nil {
			t.Fatalf("pod %s container %s: envFrom %+v names no Secret or ConfigMap of the test", p.name, ct.Name, from)
		}
		for k, v := range data {
			env[from.Prefix+k] = v
		}
	}
	for _, e := range ct.Env {
		where := fmt.Sprintf("pod %s container %s env %s", p.name, ct.Name, e.Name)
		if e.ValueFrom == nil {
			env[e.Name] = expandVars(e.Value, env)
			continue
		}
		switch vf := e.ValueFrom; {
		case vf.SecretKeyRef != nil:
			v, ok := c.secrets[vf.SecretKeyRef.Name][vf.SecretKeyRef.Key]
			if !ok {
				t.Fatalf("%s: Secret %s has no key %s", where, vf.SecretKeyRef.Name, vf.SecretKeyRef.Key)
			}
			env[e.Name] = v
		case vf.ConfigMapKeyRef != nil:
			v, ok := c.configMaps[vf.ConfigMapKeyRef.Name][vf.ConfigMapKeyRef.Key]
			if !ok {
				t.Fatalf("%s: ConfigMap %s has no key %s", where, vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key)
			}
			env[e.Name] = v
		case vf.FieldRef != nil:
			switch vf.FieldRef.FieldPath {
			case "metadata.name":
				env[e.Name] = p.name
			case "metadata.namespace":
				env[e.Name] = testNamespace
			case "status.podIP", "status.hostIP":
				env[e.Name] = "127.0.0.1"
			case "spec.nodeName":
				env[e.Name] = "node-0"
			default:
				t.Fatalf("%s: downward API field %s is not one the test gives", where, vf.FieldRef.FieldPath)
			}
		case vf.ResourceFieldRef != nil:
			env[e.Name] = resourceField(t, where, ct, vf.ResourceFieldRef)
		default:
			t.Fatalf("%s: valueFrom %+v is not one the test resolves", where, vf)
		}
	}
	return env
}

// resourceField is a container's resource limit or request in units of
// the reference's divisor, rounded up, as the kubelet gives it.
func resourceField(t testing.TB, where string, ct corev1.Container, ref *corev1.ResourceFieldSelector) string {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		t.Fatalf("%s: resource %q", where, ref.Resource)
	}
	list := ct.Resources.Limits
	if kind == "requests" {
		list = ct.Resources.Requests
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		// Without a limit the kubelet gives the node's allocatable, which
		// no test stands in for.
		t.Fatalf("%s: container %s sets no %s", where, ct.Name, ref.Resource)
	}
	div := resource.MustParse("1")
	if !ref.Divisor.IsZero() {
		div = ref.Divisor
	}
	if name == "cpu" {
		return strconv.FormatInt((q.MilliValue()+div.MilliValue()-1)/div.MilliValue(), 10)
	}
	return strconv.FormatInt((q.Value()+div.Value()-1)/div.Value(), 10)
}

// envList is env as a process environment, sorted.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// service is a rendered Service with the pods it selects.
type service struct {
	*corev1.Service
	pods []*runPod
}

func (c *cluster) services() []service {
	var out []service
	for _, o := range c.objs {
		s, ok := o.obj.(*corev1.Service)
		if !ok || len(s.Spec.Selector) == 0 {
			continue
		}
		sv := service{Service: s}
		for _, p := range c.pods {
			if matchLabels(s.Spec.Selector, p.labels) {
				sv.pods = append(sv.pods, p)
			}
		}
		out = append(out, sv)
	}
	return out
}

func matchLabels(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// dnsName cuts a cluster DNS name (name, name.ns, name.ns.svc,
// name.ns.svc.cluster.local) to its first labels inside the namespace.
func dnsName(host string) (string, bool) {
	host = strings.TrimSuffix(host, ".")
	for _, suffix := range []string{"." + testNamespace + ".svc.cluster.local", "." + testNamespace + ".svc", "." + testNamespace} {
		if h, ok := strings.CutSuffix(host, suffix); ok {
			return h, true
		}
	}
	return host, !strings.Contains(host, ".") || strings.Count(host, ".") == 1
}

// resolve gives the loopback addresses (127.0.0.1:port) that host:port
// reaches from pod self: the pod itself (localhost, its IP, any address
// it listens on), a Service (one address per pod it selects, its port's
// target in each) or a StatefulSet pod's name under its governing
// Service. ok is false for a host the cluster does not know.
func (c *cluster) resolve(self *runPod, host string, port int32) ([]string, bool) {
	t := c.t
	switch host {
	case "127.0.0.1", "localhost", "0.0.0.0", "", "::", "[::]":
		if self == nil {
			return nil, false
		}
		return []string{fmt.Sprintf("127.0.0.1:%d", self.port(t, port))}, true
	}
	name, ok := dnsName(host)
	if !ok {
		return nil, false
	}
	svcs := c.services()
	for _, s := range svcs {
		if s.Name != name {
			continue
		}
		for _, sp := range s.Spec.Ports {
			if sp.Port != port {
				continue
			}
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			var out []string
			for _, p := range s.pods {
				if cp, ok := p.namedPort(target); ok {
					out = append(out, fmt.Sprintf("127.0.0.1:%d", p.port(t, cp)))
				}
			}
			if len(out) == 0 {
				t.Fatalf("Service %s port %d selects no pod with port %s", s.Name, port, target.String())
			}
			return out, true
		}
		t.Fatalf("Service %s has no port %d", s.Name, port)
	}
	// A pod of a StatefulSet: <pod>.<governing Service>.
	if podName, svc, ok := strings.Cut(name, "."); ok {
		for _, s := range svcs {
			if s.Name != svc {
				continue
			}
			for _, p := range s.pods {
				if p.name == podName {
					return []string{fmt.Sprintf("127.0.0.1:%d", p.port(t, port))}, true
				}
			}
		}
	}
	return nil, false
}

// rewriteAddr rewrites an address in a command line or a config, as
// written for the cluster, to the loopback addresses standing in for it:
// host:port, or one or more comma-separated URLs. A Service becomes one
// URL per pod it selects. Anything else is returned unchanged.
func (c *cluster) rewriteAddr(self *runPod, v string) string {
	if strings.Contains(v, "://") {
		var out []string
		for _, u := range strings.Split(v, ",") {
			pu, err := url.Parse(strings.TrimSpace(u))
			if err != nil || pu.Port() == "" {
				return v
			}
			port, _ := strconv.Atoi(pu.Port())
			addrs, ok := c.resolve(self, pu.Hostname(), int32(port))
			if !ok {
				return v
			}
			for _, a := range addrs {
				nu := *pu
				nu.Host = a
				out = append(out, nu.String())
			}
		}
		return strings.Join(out, ",")
	}
	host, ps, err := net.SplitHostPort(v)
	if err != nil {
		return v
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return v
	}
	addrs, ok := c.resolve(self, host, int32(port))
	if !ok || len(addrs) != 1 {
		return v
	}
	return addrs[0]
}

// rewriteArgs returns a container's command line for its process: $(VAR)
// expanded, addresses rewritten (rewriteAddr), the value of a --*-port
// flag that is a port of the pod moved with it, paths under a volume's
// mount moved to the directory standing in for the volume.
func (c *cluster) rewriteArgs(p *runPod, ct corev1.Container, args []string, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		a = expandVars(a, env)
		a = c.rewriteAddr(p, a)
		if i > 0 && strings.HasSuffix(args[i-1], "-port") {
			if n, err := strconv.Atoi(a); err == nil && p.hasPort(int32(n)) {
				a = strconv.Itoa(p.port(c.t, int32(n)))
			}
		}
		if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "-") {
			a = name + "=" + c.hostPath(p, ct, val)
		} else {
			a = c.hostPath(p, ct, a)
		}
		out[i] = a
	}
	return out
}

// hasPort reports whether a container of the pod declares port n.
func (p *runPod) hasPort(n int32) bool {
	for _, ct := range p.spec.Containers {
		for _, cp := range ct.Ports {
			if cp.ContainerPort == n {
				return true
			}
		}
	}
	return false
}

// hostPath maps an absolute path under one of ct's volume mounts to the
// directory standing in for the volume.
func (c *cluster) hostPath(p *runPod, ct corev1.Container, v string) string {
	if !strings.HasPrefix(v, "/") {
		return v
	}
	best := ""
	var mount corev1.VolumeMount
	for _, m := range ct.VolumeMounts {
		mp := path.Clean(m.MountPath)
		if (v == mp || strings.HasPrefix(v, mp+"/")) && len(mp) > len(best) {
			best, mount = mp, m
		}
	}
	if best == "" {
		return v
	}
	dir := c.volume(p, mount.Name)
	return filepath.Join(dir, mount.SubPath, strings.TrimPrefix(v, best))
}

// volume returns the directory standing in for a volume of the pod: an
// emptyDir or a StatefulSet's claim is an empty directory, a ConfigMap or
// Secret volume one holding its keys as files.
func (c *cluster) volume(p *runPod, name string) string {
	t := c.t
	if dir, ok := p.mounts[name]; ok {
		return dir
	}
	dir := t.TempDir()
	p.mounts[name] = dir
	var data map[string]string
	for _, v := range p.spec.Volumes {
		if v.Name != name {
			continue
		}
		switch {
		case v.ConfigMap != nil:
			data = c.configMaps[v.ConfigMap.Name]
			if data == nil {
				t.Fatalf("pod %s: volume %s: no ConfigMap %s rendered", p.name, name, v.ConfigMap.Name)
			}
		case v.Secret != nil:
			data = c.secrets[v.Secret.SecretName]
			if data == nil {
				t.Fatalf("pod %s: volume %s: the test has no Secret %s", p.name, name, v.Secret.SecretName)
			}
		}
	}
	keys := slices.Collect(maps.Keys(data))
	sort.Strings(keys)
	for _, k := range keys {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(data[k]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// probeURL is the loopback URL of an HTTP probe of a container of p.
func (c *cluster) probeURL(p *runPod, ct corev1.Container, pr *corev1.Probe) string {
	if pr == nil || pr.HTTPGet == nil {
		return ""
	}
	cp, ok := containerPort(ct, pr.HTTPGet.Port)
	if !ok {
		c.t.Fatalf("pod %s container %s: probe port %s is none of its ports", p.name, ct.Name, pr.HTTPGet.Port.String())
	}
	scheme := "http"
	if pr.HTTPGet.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	return fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, p.port(c.t, cp), pr.HTTPGet.Path)
}
