package helmtest

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// engineCapabilitiesAnnotation names, on a pool's pod, the capabilities
// its engine container adds beyond Pod Security "restricted" (the pool's
// engineCapabilities).
const engineCapabilitiesAnnotation = "switchyard.ai/engine-capabilities"

// Pod Security Standards (kubernetes.io/docs/concepts/security/
// pod-security-standards), the sets the "baseline" and "restricted"
// profiles allow.
var (
	// Baseline, "Sysctls": the safe set.
	pssSafeSysctls = []string{
		"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
		"net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
		"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
		"net.ipv4.tcp_keepalive_probes",
	}
	// Baseline, "SELinux": the types a container may take.
	pssSELinuxTypes = []string{"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)

// checkPodSecurity applies the rules of the Pod Security Standards'
// "restricted" profile (which includes "baseline") to a rendered pod,
// every container of it; the capabilities a pool's pod names in its
// engine-capabilities annotation may be added to its engine (the first
// container), and nothing else.
func checkPodSecurity(t testing.TB, where string, w workload) {
	t.Helper()
	for _, v := range podSecurityViolations(w.spec, w.annotations) {
		t.Errorf("%s: Pod Security restricted: %s", where, v)
	}
}

func podSecurityViolations(spec corev1.PodSpec, annotations map[string]string) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	// Baseline: host namespaces, HostProcess, hostPath, sysctls.
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		bad("hostNetwork, hostPID and hostIPC must be unset or false")
	}
	for _, v := range spec.Volumes {
		// Restricted, "Volume Types": only these; hostPath among the others refused.
		src := v.VolumeSource
		if src.ConfigMap == nil && src.CSI == nil && src.DownwardAPI == nil && src.EmptyDir == nil &&
			src.Ephemeral == nil && src.PersistentVolumeClaim == nil && src.Projected == nil && src.Secret == nil {
			bad("volume %s: type not allowed (configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret)", v.Name)
		}
	}
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	for _, s := range psc.Sysctls {
		if !slices.Contains(pssSafeSysctls, s.Name) {
			bad("sysctl %s is not of the safe set", s.Name)
		}
	}
	if w := psc.WindowsOptions; w != nil && w.HostProcess != nil && *w.HostProcess {
		bad("windowsOptions.hostProcess")
	}
	out = append(out, seLinuxViolations("pod", psc.SELinuxOptions)...)
	if p := psc.AppArmorProfile; p != nil && p.Type == corev1.AppArmorProfileTypeUnconfined {
		bad("pod appArmorProfile Unconfined")
	}
	for k, v := range annotations {
		if strings.HasPrefix(k, "container.apparmor.security.beta.kubernetes.io/") && v != "runtime/default" && !strings.HasPrefix(v, "localhost/") {
			bad("annotation %s: %s", k, v)
		}
	}
	// Restricted: running as non-root, not as uid 0, seccomp.
	podNonRoot := psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		bad("pod runAsUser 0")
	}
	podSeccomp := ""
	if psc.SeccompProfile != nil {
		podSeccomp = string(psc.SeccompProfile.Type)
	}
	if podSeccomp == string(corev1.SeccompProfileTypeUnconfined) {
		bad("pod seccompProfile Unconfined")
	}

	extra := map[string]bool{}
	for _, c := range strings.Split(annotations[engineCapabilitiesAnnotation], ",") {
		if c = strings.TrimSpace(c); c != "" {
			extra[c] = true
		}
	}
	type ctr struct {
		kind string
		c    corev1.Container
	}
	var all []ctr
	for _, c := range spec.InitContainers {
		all = append(all, ctr{"init container", c})
	}
	for i, c := range spec.Containers {
		kind := "container"
		if i == 0 && len(extra) > 0 {
			kind = "engine container"
		}
		all = append(all, ctr{kind, c})
	}
	for _, e := range spec.EphemeralContainers {
		all = append(all, ctr{"ephemeral container", corev1.Container(e.EphemeralContainerCommon)})
	}
	for _, x := range all {
		c, where := x.c, x.kind+" "+x.c.Name
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				bad("%s: hostPort %d", where, p.HostPort)
			}
		}
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		if sc.Privileged != nil && *sc.Privileged {
			bad("%s: privileged", where)
		}
		if w := sc.WindowsOptions; w != nil && w.HostProcess != nil && *w.HostProcess {
			bad("%s: windowsOptions.hostProcess", where)
		}
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			bad("%s: procMount %s", where, *sc.ProcMount)
		}
		out = append(out, seLinuxViolations(where, sc.SELinuxOptions)...)
		if p := sc.AppArmorProfile; p != nil && p.Type == corev1.AppArmorProfileTypeUnconfined {
			bad("%s: appArmorProfile Unconfined", where)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			bad("%s: allowPrivilegeEscalation must be false", where)
		}
		switch {
		case sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot:
			bad("%s: runAsNonRoot false", where)
		case sc.RunAsNonRoot == nil && !podNonRoot:
			bad("%s: runAsNonRoot set neither on the pod nor on the container", where)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			bad("%s: runAsUser 0", where)
		}
		seccomp := podSeccomp
		if sc.SeccompProfile != nil {
			seccomp = string(sc.SeccompProfile.Type)
		}
		if seccomp != string(corev1.SeccompProfileTypeRuntimeDefault) && seccomp != string(corev1.SeccompProfileTypeLocalhost) {
			bad("%s: seccompProfile %q: want RuntimeDefault or Localhost, on the pod or the container", where, seccomp)
		}
		var drop, add []string
		if sc.Capabilities != nil {
			for _, d := range sc.Capabilities.Drop {
				drop = append(drop, string(d))
			}
			for _, a := range sc.Capabilities.Add {
				add = append(add, string(a))
			}
		}
		if !slices.Contains(drop, "ALL") {
			bad("%s: capabilities.drop %v must include ALL", where, drop)
		}
		for _, a := range add {
			if a == "NET_BIND_SERVICE" || (x.kind == "engine container" && extra[a]) {
				continue
			}
			bad("%s: capabilities.add %s: only NET_BIND_SERVICE (and on the engine the pod's %s)", where, a, engineCapabilitiesAnnotation)
		}
	}
	return out
}

func seLinuxViolations(where string, o *corev1.SELinuxOptions) []string {
	if o == nil {
		return nil
	}
	var out []string
	if !slices.Contains(pssSELinuxTypes, o.Type) {
		out = append(out, fmt.Sprintf("%s: seLinuxOptions.type %s", where, o.Type))
	}
	if o.User != "" || o.Role != "" {
		out = append(out, fmt.Sprintf("%s: seLinuxOptions user and role must be unset", where))
	}
	return out
}

// checkGoRuntime: a Switchyard container runs with GOGC=400 and a
// GOMEMLIMIT under its memory limit (about 90% of it), read from the limit
// itself through the downward API.
func checkGoRuntime(t testing.TB, where string, c corev1.Container) {
	t.Helper()
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if g := env["GOGC"]; g.Value != "400" {
		t.Errorf("%s: GOGC %q, want 400", where, g.Value)
	}
	limit := c.Resources.Limits.Memory()
	if limit.IsZero() {
		t.Errorf("%s: no memory limit for GOMEMLIMIT to follow", where)
		return
	}
	gml, ok := env["GOMEMLIMIT"]
	if !ok {
		t.Errorf("%s: no GOMEMLIMIT", where)
		return
	}
	v, ok := strings.CutPrefix(gml.Value, "$(")
	ref, unit, ok2 := strings.Cut(v, ")")
	if !ok || !ok2 || unit != "MiB" {
		t.Errorf("%s: GOMEMLIMIT %q: want $(VAR)MiB, VAR from the memory limit", where, gml.Value)
		return
	}
	src, ok := env[ref]
	if !ok || src.ValueFrom == nil || src.ValueFrom.ResourceFieldRef == nil {
		t.Errorf("%s: GOMEMLIMIT reads %s, which is not from a resourceFieldRef", where, ref)
		return
	}
	// Kubernetes resolves $(VAR) only from variables defined before.
	if slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == ref }) > slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" }) {
		t.Errorf("%s: %s is defined after GOMEMLIMIT, which cannot expand it", where, ref)
	}
	r := src.ValueFrom.ResourceFieldRef
	if r.Resource != "limits.memory" || (r.ContainerName != "" && r.ContainerName != c.Name) {
		t.Errorf("%s: %s from %s of container %q, want limits.memory of %s", where, ref, r.Resource, r.ContainerName, c.Name)
		return
	}
	divisor := r.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	// The downward API rounds the quotient up.
	mib := math.Ceil(float64(limit.Value()) / float64(divisor.Value()))
	got := mib * (1 << 20)
	if share := got / float64(limit.Value()); share < 0.8 || share >= 1 {
		t.Errorf("%s: GOMEMLIMIT resolves to %.0f MiB, %.1f%% of the %s limit: want about 90%%", where, mib, 100*share, limit.String())
	}
}

// TestPodSecurityRules: each rule of the profile refuses what it exists
// for, and a pod that keeps them all passes.
func TestPodSecurityRules(t *testing.T) {
	yes, no := true, false
	root := int64(0)
	good := func() corev1.PodSpec {
		return corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "c",
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_BIND_SERVICE"}},
				},
			}},
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		}
	}
	if v := podSecurityViolations(good(), nil); len(v) > 0 {
		t.Fatalf("a restricted pod: %v", v)
	}
	for _, tt := range []struct {
		name        string
		annotations map[string]string
		mod         func(*corev1.PodSpec)
	}{
		{"host network", nil, func(s *corev1.PodSpec) { s.HostNetwork = true }},
		{"host PID", nil, func(s *corev1.PodSpec) { s.HostPID = true }},
		{"hostPath volume", nil, func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}},
		{"NFS volume", nil, func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "n", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "x", Path: "/"}}})
		}},
		{"unsafe sysctl", nil, func(s *corev1.PodSpec) {
			s.SecurityContext.Sysctls = []corev1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}}
		}},
		{"host port", nil, func(s *corev1.PodSpec) {
			s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
		}},
		{"privileged", nil, func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Privileged = &yes }},
		{"privilege escalation unset", nil, func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil }},
		{"root allowed", nil, func(s *corev1.PodSpec) { s.SecurityContext.RunAsNonRoot = nil }},
		{"container says root", nil, func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.RunAsNonRoot = &no }},
		{"uid 0", nil, func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.RunAsUser = &root }},
		{"no seccomp", nil, func(s *corev1.PodSpec) { s.SecurityContext.SeccompProfile = nil }},
		{"seccomp unconfined", nil, func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}},
		{"capabilities kept", nil, func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Capabilities.Drop = nil }},
		{"capability added", nil, func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = append(s.Containers[0].SecurityContext.Capabilities.Add, "SYS_ADMIN")
		}},
		{"capability beyond the annotation's", map[string]string{engineCapabilitiesAnnotation: "IPC_LOCK"}, func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"IPC_LOCK", "SYS_ADMIN"}
		}},
		{"annotated capability on another container", map[string]string{engineCapabilitiesAnnotation: "IPC_LOCK"}, func(s *corev1.PodSpec) {
			c := s.Containers[0].DeepCopy()
			c.Name = "agent"
			c.SecurityContext.Capabilities.Add = []corev1.Capability{"IPC_LOCK"}
			s.Containers = append(s.Containers, *c)
		}},
		{"init container unguarded", nil, func(s *corev1.PodSpec) { s.InitContainers = []corev1.Container{{Name: "init"}} }},
		{"SELinux user", nil, func(s *corev1.PodSpec) { s.SecurityContext.SELinuxOptions = &corev1.SELinuxOptions{User: "system_u"} }},
		{"proc mount", nil, func(s *corev1.PodSpec) {
			u := corev1.UnmaskedProcMount
			s.Containers[0].SecurityContext.ProcMount = &u
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := good()
			tt.mod(&s)
			v := podSecurityViolations(s, tt.annotations)
			if len(v) == 0 {
				t.Fatal("accepted")
			}
			t.Logf("refused: %s", strings.Join(v, "; "))
		})
	}
	// The annotation's capability on the engine passes.
	s := good()
	s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"IPC_LOCK"}
	if v := podSecurityViolations(s, map[string]string{engineCapabilitiesAnnotation: "IPC_LOCK"}); len(v) > 0 {
		t.Errorf("the engine's declared capability: %v", v)
	}
}
