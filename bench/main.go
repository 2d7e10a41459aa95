// Command bench is Switchyard's benchmark scenario runner: in one
// invocation it builds the broker, the worker-agent and the sim-engine,
// starts every party as its own process on loopback ports, measures
// Switchyard side by side with calling the engines directly, nginx and
// HAProxy in front of the same engines, and writes the tables and SVG
// plots of docs/benchmarks-peers.md.
//
//	go run ./bench                      # everything, about 75 minutes
//	go run ./bench --quick              # shorter windows, for a smoke run
//	go run ./bench --only overhead,dispatch
//	go run ./bench --only goodput       # about 50 minutes
//	go run ./bench --only fleet         # about 2 minutes; table on stdout
//
// Scenarios: overhead (added TTFT/ITL and relayed tokens/s, plus a CPU
// profile of the broker and an agent), scheduling (a heterogeneous fleet
// at 90% load), tokenpath (CPU per request and per token by process
// group against nginx, HAProxy and a plain Go reverse proxy, relayed
// tokens/s at saturation, added TTFT, with a profile per load shape; its
// ratio table also printed on stdout), transition (regular to
// prefill/decode, count versus capacity mode), dispatch (the dispatch
// benchmarks and broker memory at 1,000 streams), rollout (a realistic
// rollout, its per-window table also printed on stdout), affinity
// (multi-turn chat with prefix caching, affinity versus pure pull and
// nginx), goodput (the highest rate at which 90% of requests meet
// latency targets, per dispatch mode and step of a rollout from regular
// to PD, on batch-model engines), and, only when named, fleet (a broker
// listening to 100 to 5,000 simulated agents at rest: its CPU per
// heartbeat, RSS, the time a new broker takes to see the fleet and a
// silent agent to stop counting; its table goes to stdout, for
// docs/performance.md). nginx and HAProxy are installed with
// apt-get when missing (Debian, as root). Every process the runner starts
// is stopped when it ends, fails or is interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 2 && (os.Args[1] == "__broker" || os.Args[1] == "__agent") {
		if err := profiled(os.Args[1], os.Args[2], os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if (len(os.Args) == 3 || len(os.Args) == 8) && os.Args[1] == natsArg {
		if err := runNATS(os.Args[2], os.Args[3:]...); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", natsArg, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 3 && os.Args[1] == goproxyArg {
		if err := runGoProxy(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", goproxyArg, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && (os.Args[1] == echoArg || os.Args[1] == pingArg) {
		var err error
		if os.Args[1] == echoArg {
			err = runEcho()
		} else if len(os.Args) == 4 {
			err = runPing(os.Args[2], os.Args[3])
		} else {
			err = fmt.Errorf("usage: %s ADDR COUNT", pingArg)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

var scenarios = []string{"overhead", "tokenpath", "scheduling", "transition", "dispatch", "rollout", "affinity", "goodput", "fleet"}

// peerScenarios are the scenarios of benchmarks-peers.md, the default.
// fleet, whose table belongs to docs/performance.md, runs when asked for
// by name and prints its table on stdout.
var peerScenarios = scenarios[:len(scenarios)-1]

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	out := fs.String("out", "docs", "directory of benchmarks-peers.md (plots go to its img/)")
	quick := fs.Bool("quick", false, "shorter measurement windows (a smoke run; figures are noisier)")
	only := fs.String("only", strings.Join(peerScenarios, ","), "comma-separated scenarios: "+strings.Join(scenarios, ","))
	fleetSizesFlag := fs.String("fleet-sizes", joinInts(fleetSizes), "fleet: comma-separated numbers of simulated agents")
	fleetWindow := fs.Duration("fleet-window", 8*time.Second, "fleet: CPU measurement window per fleet size")
	fleetCluster := fs.String("fleet-cluster", "", "fleet: comma-separated numbers of real agents run against a 3-node nats-server cluster and several brokers (empty: none)")
	fleetDirected := fs.Bool("fleet-directed", true, "fleet: on the cluster, every agent pulls a directed queue of its own too (false: --no-directed)")
	fleetReal := fs.String("fleet-real", "8,32", "fleet: comma-separated numbers of real agents (agent package, in-process simulator) whose JetStream consumers and nats-server memory are read (empty: none)")
	goDefaults := fs.Bool("go-defaults", false, "run the broker and agents at the Go runtime's defaults instead of the settings the Dockerfile deploys them with (GOGC=400; agents GOMAXPROCS=2)")
	keep := fs.Bool("keep", false, "keep the scratch directory (process logs, configs, profiles)")
	profiles := fs.String("profiles", "", "directory to copy the tokenpath scenario's profiles to: CPU (broker-<n>tok.pprof, agent-<n>tok.pprof) and heap (broker-<n>tok.allocs.pprof, agent-<n>tok.allocs.pprof); with it the fleet scenario's broker runs under a CPU profile too (fleet-<agents>.pprof)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	want := map[string]bool{}
	for s := range strings.SplitSeq(*only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(scenarios, s) {
			return fmt.Errorf("--only: unknown scenario %q (want %s)", s, strings.Join(scenarios, ","))
		}
		want[s] = true
	}
	var sizes, clusterSizes []int
	var err error
	if *fleetSizesFlag != "" {
		if sizes, err = parseInts(*fleetSizesFlag); err != nil {
			return fmt.Errorf("--fleet-sizes: %w", err)
		}
	}
	if *fleetCluster != "" {
		if clusterSizes, err = parseInts(*fleetCluster); err != nil {
			return fmt.Errorf("--fleet-cluster: %w", err)
		}
	}
	var realSizes []int
	if *fleetReal != "" {
		if realSizes, err = parseInts(*fleetReal); err != nil {
			return fmt.Errorf("--fleet-real: %w", err)
		}
	}
	if !fileExists("go.mod") || !fileExists("cmd/broker") {
		return errors.New("run from the repository root: go run ./bench")
	}
	tmp, err := os.MkdirTemp("", "switchyard-bench-")
	if err != nil {
		return err
	}
	start := time.Now()
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	defer func() {
		if *keep {
			logf("scratch directory kept: %s", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	e := &env{ctx: ctx, bin: filepath.Join(tmp, "bin"), self: self, tmp: tmp, sup: &supervisor{dir: tmp}, quick: *quick, logf: logf, profiles: *profiles, goDefaults: *goDefaults}
	defer e.sup.stopAll()

	logf("building broker, worker-agent and sim-engine into %s", e.bin)
	build := exec.CommandContext(ctx, "go", "build", "-o", e.bin+"/", "./cmd/broker", "./cmd/worker-agent", "./cmd/sim-engine")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, b)
	}
	if want["overhead"] || want["scheduling"] || want["tokenpath"] || want["affinity"] {
		if err := e.ensureProxies(); err != nil {
			return err
		}
	}
	d := &doc{out: *out, command: "go run ./bench " + strings.Join(args, " ")}
	d.machine = machine(e)
	loadStart := loadavg()
	steps := []struct {
		name string
		fn   func(*doc) error
	}{
		{"overhead", e.overhead},
		{"tokenpath", e.tokenpath},
		{"scheduling", e.scheduling},
		{"transition", e.transition},
		{"dispatch", func(d *doc) error {
			if err := e.dispatchCost(d); err != nil {
				return err
			}
			return e.memory(d)
		}},
		{"rollout", e.rollout},
		{"affinity", e.affinityScenario},
		{"goodput", e.goodput},
		{"fleet", func(d *doc) error {
			return e.fleetScenario(d, sizes, realSizes, clusterSizes, *fleetDirected, *fleetWindow)
		}},
	}
	for _, s := range steps {
		if !want[s.name] {
			continue
		}
		if err := s.fn(d); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		// Each scenario starts from a clean machine.
		e.sup.stopAll()
	}
	d.elapsed = time.Since(start)
	if len(want) == 1 && want["fleet"] {
		// Its table went to stdout; benchmarks-peers.md keeps the peers'.
		return nil
	}
	d.machine += fmt.Sprintf("\nLoad average (1, 5, 15 min) at the start: %s; at the end: %s.\n", loadStart, loadavg())
	path := filepath.Join(*out, "benchmarks-peers.md")
	if err := d.write(path); err != nil {
		return err
	}
	logf("wrote %s", path)
	return nil
}

// doc collects the sections of benchmarks-peers.md.
type doc struct {
	out, command, machine string
	sections              []string
	targets               []target
	notes                 []string
	profiles              []string
	elapsed               time.Duration
}

type target struct {
	name, want, got string
	met             bool
}

func (d *doc) add(s string)  { d.sections = append(d.sections, s) }
func (d *doc) note(s string) { d.notes = append(d.notes, s) }
func (d *doc) target(name, want, got string, met bool) {
	d.targets = append(d.targets, target{name, want, got, met})
}

func (d *doc) write(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks against the limit and the peers\n\n")
	fmt.Fprintf(&b, "Generated by the scenario runner (`bench/`); do not edit by hand, run it again:\n\n```sh\n%s\n```\n\n", strings.TrimSpace(d.command))
	fmt.Fprintf(&b, "It builds `./cmd/broker`, `./cmd/worker-agent` and `./cmd/sim-engine`, starts every engine, broker, agent and proxy as a separate process on loopback ports, "+
		"drives them with the load generator (`loadgen`, in the runner's process), stops everything it started and writes this file and the plots under `img/`. "+
		"`--quick` shortens every window, `--only overhead,scheduling,transition,dispatch` picks scenarios. The whole run took %s.\n\n", d.elapsed.Round(time.Second))
	fmt.Fprintf(&b, "## Machine\n\n%s\n", d.machine)
	if len(d.targets) > 0 {
		fmt.Fprintf(&b, "## Targets\n\n| target | wanted | measured | |\n|---|---|---|---|\n")
		for _, t := range d.targets {
			verdict := "met"
			if !t.met {
				verdict = "**missed**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.name, t.want, t.got, verdict)
		}
		fmt.Fprintf(&b, "\n")
		for _, n := range d.notes {
			fmt.Fprintf(&b, "%s\n", n)
		}
		if len(d.profiles) > 0 {
			fmt.Fprintf(&b, "\nWhere the CPU goes (largest areas of the profiles below): %s.\n", strings.Join(d.profiles, "; "))
		}
		fmt.Fprintf(&b, "\n")
	}
	for _, s := range d.sections {
		b.WriteString(s)
		if !strings.HasSuffix(s, "\n\n") {
			b.WriteString("\n")
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(strings.TrimRight(b.String(), "\n")+"\n"), 0o644)
}

func machine(e *env) string {
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]); len(f) >= 2 {
			var kb float64
			fmt.Sscan(f[1], &kb)
			mem = fmt.Sprintf("%.0f GiB", kb/1024/1024)
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	goVer, _ := exec.Command("go", "version").Output()
	var b strings.Builder
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| CPUs (nproc) | %d |\n| CPU model | %s |\n| memory | %s |\n| kernel | Linux %s |\n| Go | %s |\n",
		runtime.NumCPU(), cpu, mem, strings.TrimSpace(string(kernel)), strings.TrimSpace(string(goVer)))
	fmt.Fprintf(&b, "| nginx | %s |\n| HAProxy | %s |\n", versionOf(e.nginx, "-v"), versionOf(e.haproxy, "-v"))
	fmt.Fprintf(&b, "\nThe machine is shared with other work, so figures move by a few percent between runs; every party (client, engines, front end) shares the same cores.\n")
	return b.String()
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func fmtMS(ms float64) string {
	a := ms
	if a < 0 {
		a = -a
	}
	switch {
	case a < 10:
		return fmt.Sprintf("%.3f ms", ms)
	case a < 100:
		return fmt.Sprintf("%.1f ms", ms)
	default:
		return fmt.Sprintf("%s ms", fmtInt(ms))
	}
}

func fmtDelta(ms float64) string {
	if ms >= 0 {
		return "+" + fmtMS(ms)
	}
	return "−" + fmtMS(-ms)
}

func fmtDur(d time.Duration) string { return fmtMS(float64(d) / float64(time.Millisecond)) }

// fmtInt formats a number rounded to an integer with thousands separators.
func fmtInt(v float64) string {
	n := int64(v + 0.5)
	if v < 0 {
		n = int64(v - 0.5)
	}
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// maxSSEEvent bounds an SSE line and event the runner reads from a
// server: longer is a broken answer.
const maxSSEEvent = 1 << 20
