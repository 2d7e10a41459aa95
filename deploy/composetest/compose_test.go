package composetest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// strList is a compose field written as a list or as one string.
type strList []string

func (s *strList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*s = strings.Fields(n.Value)
		return nil
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		*s = l
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list", n.Line)
}

// dependsOn is depends_on in its list or its map form.
type dependsOn []string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		*d = l
		return nil
	case yaml.MappingNode:
		var m map[string]yaml.Node
		if err := n.Decode(&m); err != nil {
			return err
		}
		for k := range m {
			*d = append(*d, k)
		}
		slices.Sort(*d)
		return nil
	}
	return fmt.Errorf("line %d: depends_on: want a list or a map", n.Line)
}

type build struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
	Target     string `yaml:"target"`
}

func (b *build) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain build
	return n.Decode((*plain)(b))
}

type service struct {
	Image      string    `yaml:"image"`
	Build      *build    `yaml:"build"`
	Command    strList   `yaml:"command"`
	Entrypoint strList   `yaml:"entrypoint"`
	DependsOn  dependsOn `yaml:"depends_on"`
	Volumes    []string  `yaml:"volumes"`
	Profiles   []string  `yaml:"profiles"`
	Configs    []struct {
		Source string `yaml:"source"`
		Target string `yaml:"target"`
	} `yaml:"configs"`
}

type compose struct {
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
	Configs  map[string]struct {
		Content string `yaml:"content"`
		File    string `yaml:"file"`
	} `yaml:"configs"`
}

const (
	beginExample = "# BEGIN vllm example"
	endExample   = "# END vllm example"
	exampleLine  = "# vllm example"
)

// withExample uncomments the vLLM example block of compose.yaml (and the
// lines marked for it), as an operator would.
func withExample(t *testing.T, src string) string {
	t.Helper()
	var out []string
	in := false
	seen := false
	for _, line := range strings.Split(src, "\n") {
		trim := strings.TrimSpace(line)
		switch {
		case trim == beginExample:
			in, seen = true, true
			continue
		case trim == endExample:
			in = false
			continue
		case in || strings.HasSuffix(trim, exampleLine):
			i := strings.Index(line, "# ")
			if i < 0 {
				if trim == "#" {
					continue
				}
				t.Fatalf("example line %q is not commented", line)
			}
			line = line[:i] + line[i+2:]
			line = strings.TrimSuffix(strings.TrimRight(line, " "), exampleLine)
		}
		out = append(out, line)
	}
	if !seen {
		t.Fatalf("compose.yaml has no %q block", beginExample)
	}
	return strings.Join(out, "\n")
}

func parse(t *testing.T, src string) compose {
	t.Helper()
	var c compose
	if err := yaml.Unmarshal([]byte(src), &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("compose.yaml has no services")
	}
	return c
}

// dockerfile is what the checks need from a Dockerfile: its stages and the
// binary each one runs.
type dockerfile struct {
	stages      []string
	entrypoints map[string]string // stage -> base name of the ENTRYPOINT binary
}

var (
	fromRe  = regexp.MustCompile(`(?i)^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$`)
	copyRe  = regexp.MustCompile(`(?i)^COPY\s+.*--from=(\S+)`)
	entryRe = regexp.MustCompile(`(?i)^ENTRYPOINT\s+\[\s*"([^"]+)"`)
)

func parseDockerfile(t testing.TB, path string) dockerfile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := dockerfile{entrypoints: map[string]string{}}
	entry := map[string]string{}
	base := map[string]string{}
	cur := ""
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if m := fromRe.FindStringSubmatch(line); m != nil {
			cur = m[2]
			if cur == "" {
				cur = fmt.Sprintf("stage-%d", len(d.stages))
			}
			if slices.Contains(d.stages, cur) {
				t.Errorf("%s:%d: stage %s defined twice", path, i+1, cur)
			}
			d.stages = append(d.stages, cur)
			base[cur] = m[1]
			if e, ok := entry[m[1]]; ok { // inherits its base stage's entrypoint
				entry[cur] = e
			}
		}
		if m := copyRe.FindStringSubmatch(line); m != nil && !slices.Contains(d.stages, m[1]) {
			t.Errorf("%s:%d: COPY --from=%s: no earlier stage of that name", path, i+1, m[1])
		}
		if m := entryRe.FindStringSubmatch(line); m != nil {
			entry[cur] = filepath.Base(m[1])
		}
	}
	d.entrypoints = entry
	return d
}

var usageFlag = regexp.MustCompile(`(?m)^  --?([A-Za-z0-9][-A-Za-z0-9_.]*)`)

// usageFlags reads flag names from Go flag package usage text.
func usageFlags(t *testing.T, what, usage string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range usageFlag.FindAllStringSubmatch(usage, -1) {
		out[m[1]] = true
	}
	if len(out) < 3 {
		t.Fatalf("%s -h listed %d flags; usage:\n%s", what, len(out), usage)
	}
	return out
}

// commandFlags asks each command which flags it accepts: the broker and
// the agent in-process, the others from the -h of a freshly built binary.
func commandFlags(t *testing.T, root string) map[string]map[string]bool {
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
		if err := run(context.Background(), []string{"-h"}, cmdtest.NoEnv, io.Discard, &stderr); err != nil {
			t.Fatalf("%s -h: %v", name, err)
		}
		flags[name] = usageFlags(t, name, stderr.String())
	}
	var mains []string
	for _, name := range []string{"sim-engine", "loadgen"} {
		if _, err := os.Stat(filepath.Join(root, "cmd", name)); err == nil {
			mains = append(mains, name)
		}
	}
	bin := t.TempDir()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	args := []string{"build", "-o", bin + string(os.PathSeparator)}
	for _, m := range mains {
		args = append(args, "./cmd/"+m)
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, m := range mains {
		var out bytes.Buffer
		c := exec.Command(filepath.Join(bin, m), "-h")
		c.Stdout, c.Stderr = &out, &out
		_ = c.Run() // -h exits 0 or 2 depending on the command
		flags[m] = usageFlags(t, m, out.String())
	}
	flagsCache = flags
	return flags
}

// The flag lists are the same for every test; building the commands once
// keeps the package fast.
var (
	flagsMu    sync.Mutex
	flagsCache map[string]map[string]bool
)

// urlHosts returns the host and port of each URL in a comma-separated list.
func urlHosts(t testing.TB, where, list string) [][2]string {
	t.Helper()
	var out [][2]string
	for _, s := range strings.Split(list, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.Host == "" {
			t.Errorf("%s: %q is not a URL", where, s)
			continue
		}
		out = append(out, [2]string{u.Hostname(), u.Port()})
	}
	return out
}

func isNATS(s service) bool {
	return strings.HasPrefix(s.Image, "nats:") || s.Image == "nats"
}

func sortedNames[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkCompose runs every check on one parsed compose file.
func checkCompose(t testing.TB, root string, c compose, flags map[string]map[string]bool) {
	t.Helper()
	dockerfiles := map[string]dockerfile{}
	natsServices := map[string]bool{}
	for name, s := range c.Services {
		if isNATS(s) {
			natsServices[name] = true
		}
	}
	if len(natsServices) != 3 {
		t.Errorf("want a 3-node NATS cluster, have %v", sortedNames(natsServices))
	}

	for _, name := range sortedNames(c.Services) {
		s := c.Services[name]
		where := "service " + name

		for _, d := range s.DependsOn {
			if _, ok := c.Services[d]; !ok {
				t.Errorf("%s: depends_on %s, which is no service", where, d)
			}
		}
		for _, v := range s.Volumes {
			src, _, ok := strings.Cut(v, ":")
			if ok && !strings.HasPrefix(src, ".") && !strings.HasPrefix(src, "/") && !strings.HasPrefix(src, "~") {
				if _, ok := c.Volumes[src]; !ok {
					t.Errorf("%s: volume %s is not declared under volumes", where, src)
				}
			}
		}
		for _, cf := range s.Configs {
			if _, ok := c.Configs[cf.Source]; !ok {
				t.Errorf("%s: config %s is not declared under configs", where, cf.Source)
			}
		}

		// Which binary runs, and so which flags it accepts.
		binary := ""
		if s.Build != nil {
			ctxDir := filepath.Join(root, s.Build.Context)
			if st, err := os.Stat(ctxDir); err != nil || !st.IsDir() {
				t.Errorf("%s: build context %q is not a directory", where, s.Build.Context)
				continue
			}
			df := s.Build.Dockerfile
			if df == "" {
				df = "Dockerfile"
			}
			dfPath := filepath.Join(ctxDir, df)
			if _, err := os.Stat(dfPath); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			d, ok := dockerfiles[dfPath]
			if !ok {
				d = parseDockerfile(t, dfPath)
				dockerfiles[dfPath] = d
			}
			if s.Build.Target == "" || !slices.Contains(d.stages, s.Build.Target) {
				t.Errorf("%s: target %q is not a stage of %s (stages %v)", where, s.Build.Target, df, d.stages)
				continue
			}
			binary = d.entrypoints[s.Build.Target]
			if len(s.Entrypoint) > 0 {
				binary = filepath.Base(s.Entrypoint[0])
			}
			if _, err := os.Stat(filepath.Join(root, "cmd", binary)); err != nil {
				t.Errorf("%s: target %s runs %q, which is no command under cmd/", where, s.Build.Target, binary)
				continue
			}
		}

		switch {
		case binary != "":
			known, ok := flags[binary]
			if !ok {
				t.Errorf("%s: no flag list for %s", where, binary)
				break
			}
			for _, f := range cmdtest.SplitFlags(s.Command) {
				if !known[f.Name] {
					t.Errorf("%s: %s has no flag --%s", where, binary, f.Name)
				}
			}
		case isNATS(s):
			checkNATS(t, where, name, s, c, natsServices)
		}

		// Every address that a command dials names a service here.
		for _, f := range cmdtest.SplitFlags(s.Command) {
			switch f.Name {
			case "nats-url":
				hosts := map[string]bool{}
				for _, hp := range urlHosts(t, where+" --nats-url", f.Value) {
					if !natsServices[hp[0]] {
						t.Errorf("%s: --nats-url host %s is no NATS service", where, hp[0])
					}
					if hp[1] != "4222" {
						t.Errorf("%s: --nats-url %s:%s: want client port 4222", where, hp[0], hp[1])
					}
					hosts[hp[0]] = true
				}
				// Every client lists every node, so it survives the loss of any one.
				if len(hosts) != len(natsServices) {
					t.Errorf("%s: --nats-url lists %v, want every node of %v", where, sortedNames(hosts), sortedNames(natsServices))
				}
			case "engine-url", "url":
				for _, hp := range urlHosts(t, where+" --"+f.Name, f.Value) {
					if _, ok := c.Services[hp[0]]; !ok {
						t.Errorf("%s: --%s host %s is no service", where, f.Name, hp[0])
					}
				}
			case "bootstrap-host":
				if _, ok := c.Services[f.Value]; !ok || f.Value != name {
					t.Errorf("%s: --bootstrap-host %s: want the service's own name, which the decode side dials", where, f.Value)
				}
			}
		}

		if binary == "broker" {
			if r, _ := cmdtest.FlagValue(s.Command, "replicas"); r != fmt.Sprint(len(natsServices)) {
				t.Errorf("%s: --replicas %q, want %d (one per NATS node)", where, r, len(natsServices))
			}
			if _, ok := cmdtest.FlagValue(s.Command, "nats-url"); !ok {
				t.Errorf("%s: the broker must use the cluster (--nats-url), not an embedded server", where)
			}
		}
	}
}

// checkNATS parses a NATS service's command as nats-server itself does and
// checks that it joins the one JetStream cluster of the file.
func checkNATS(t testing.TB, where, name string, s service, c compose, cluster map[string]bool) {
	t.Helper()
	args := slices.Clone([]string(s.Command))
	// Point -c at the inline config's content, as compose would mount it.
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-c" && args[i] != "--config" {
			continue
		}
		found := false
		for _, cf := range s.Configs {
			if cf.Target == args[i+1] {
				p := filepath.Join(t.TempDir(), "nats.conf")
				if err := os.WriteFile(p, []byte(c.Configs[cf.Source].Content), 0o600); err != nil {
					t.Fatal(err)
				}
				args[i+1], found = p, true
			}
		}
		if !found {
			t.Errorf("%s: -c %s is not a config mounted into the service", where, args[i+1])
			return
		}
	}
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	nop := func() {}
	opts, err := server.ConfigureOptions(fs, args, nop, nop, nop)
	if err != nil {
		t.Errorf("%s: nats-server refuses %q: %v", where, s.Command, err)
		return
	}
	if opts.ServerName != name {
		t.Errorf("%s: server_name %q, want the service name", where, opts.ServerName)
	}
	if !opts.JetStream || opts.StoreDir == "" {
		t.Errorf("%s: JetStream %v with store %q: want on, with a store on a volume", where, opts.JetStream, opts.StoreDir)
	}
	if opts.Cluster.Name != "switchyard" {
		t.Errorf("%s: cluster name %q", where, opts.Cluster.Name)
	}
	if opts.MaxPayload < brokercmd.DefaultMaxPayload {
		t.Errorf("%s: max_payload %d is below the broker's %d: large requests would not fit a job", where, opts.MaxPayload, brokercmd.DefaultMaxPayload)
	}
	routed := map[string]bool{}
	for _, u := range opts.Routes {
		host, port, _ := net.SplitHostPort(u.Host)
		if !cluster[host] {
			t.Errorf("%s: route %s is no NATS service", where, u)
		}
		if port != fmt.Sprint(opts.Cluster.Port) {
			t.Errorf("%s: route %s: want the cluster port %d", where, u, opts.Cluster.Port)
		}
		routed[host] = true
	}
	for other := range cluster {
		if other != name && !routed[other] {
			t.Errorf("%s: no route to %s", where, other)
		}
	}
	vol := false
	for _, v := range s.Volumes {
		if _, dst, ok := strings.Cut(v, ":"); ok && strings.TrimSuffix(dst, "/") == opts.StoreDir {
			vol = true
		}
	}
	if !vol {
		t.Errorf("%s: store %s is not on a volume: a restart would lose the stream", where, opts.StoreDir)
	}
}

func TestCompose(t *testing.T) {
	root := cmdtest.RepoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	flags := commandFlags(t, root)

	t.Run("as shipped", func(t *testing.T) {
		c := parse(t, string(src))
		checkCompose(t, root, c, flags)
		// The demo fleet has a regular pool and a PD pair.
		roles := map[string]int{}
		for _, s := range c.Services {
			if r, ok := cmdtest.FlagValue(s.Command, "role"); ok && s.Build != nil && s.Build.Target == "worker-agent" {
				roles[r]++
			}
		}
		for _, r := range []string{"regular", "prefill", "decode"} {
			if roles[r] == 0 {
				t.Errorf("no agent with --role %s (agents by role: %v)", r, roles)
			}
		}
		if _, ok := c.Services["vllm"]; ok {
			t.Error("the vLLM example must stay commented out: it needs a GPU")
		}
	})
	t.Run("with the vLLM example", func(t *testing.T) {
		c := parse(t, withExample(t, string(src)))
		checkCompose(t, root, c, flags)
		a, ok := c.Services["agent-vllm-1"]
		if !ok {
			t.Fatalf("the example has no agent-vllm-1: %v", sortedNames(c.Services))
		}
		if e, _ := cmdtest.FlagValue(a.Command, "engine"); e != "vllm" {
			t.Errorf("agent-vllm-1: --engine %q, want vllm", e)
		}
		if u, _ := cmdtest.FlagValue(a.Command, "engine-url"); u != "http://vllm:8000" {
			t.Errorf("agent-vllm-1: --engine-url %q, want http://vllm:8000", u)
		}
		if v := c.Services["vllm"]; len(v.Entrypoint) < 2 || v.Entrypoint[0] != "vllm" || v.Entrypoint[1] != "serve" {
			t.Errorf("vllm: entrypoint %q, want vllm serve", v.Entrypoint)
		}
	})
}

// TestChecksCatchMistakes makes sure the checks above fail on the mistakes
// they exist for, so a green run means something.
func TestChecksCatchMistakes(t *testing.T) {
	root := cmdtest.RepoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	flags := commandFlags(t, root)
	tests := []struct {
		name      string
		old, repl string
	}{
		{name: "unknown agent flag", old: `"--role", "regular"`, repl: `"--rol", "regular"`},
		{name: "unknown broker flag", old: `"--replicas", "3"`, repl: `"--replica", "3"`},
		{name: "unknown sim-engine flag", old: `"--pd-protocol", "vllm",`, repl: `"--pd-proto", "vllm",`},
		{name: "engine URL to no service", old: "http://sim-regular:8000", repl: "http://sim-regulr:8000"},
		{name: "missing build target", old: "target: broker}", repl: "target: brokr}"},
		{name: "route to no service", old: "nats://nats-3:6222\"]\n    volumes: [\"nats-1", repl: "nats://nats-4:6222\"]\n    volumes: [\"nats-1"},
		{name: "bad nats flag", old: `"--cluster_name", "switchyard", "--cluster", "nats://0.0.0.0:6222",` + "\n              \"--routes\", \"nats://nats-1:6222,nats://nats-2:6222,nats://nats-3:6222\"]\n    volumes: [\"nats-2", repl: `"--clustername", "switchyard", "--cluster", "nats://0.0.0.0:6222",` + "\n              \"--routes\", \"nats://nats-1:6222,nats://nats-2:6222,nats://nats-3:6222\"]\n    volumes: [\"nats-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.Count(string(src), tt.old) < 1 {
				t.Fatalf("compose.yaml no longer contains %q; update the test", tt.old)
			}
			broken := strings.Replace(string(src), tt.old, tt.repl, 1)
			rec := &cmdtest.Recorder{TB: t}
			checkCompose(rec, root, parse(t, broken), flags)
			if len(rec.Errs) == 0 {
				t.Errorf("no check failed")
			}
			t.Logf("caught: %s", strings.Join(rec.Errs, "; "))
		})
	}
}
