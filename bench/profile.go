package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/loadgen"
)

// profiled is the re-executed form of this program: "__broker FILE args"
// or "__agent FILE args" runs the broker or worker-agent command in this
// process under a CPU profile written to FILE when it stops (on SIGTERM),
// and its heap profile to FILE.allocs.
// There is no pprof endpoint in either command, and running them here
// keeps the load generator out of the profile.
func profiled(kind, file string, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	// The heap profile (allocations since the start, at the runtime's
	// default sampling, and what was in use at the last collection) goes
	// beside the CPU profile.
	defer func() {
		if a, err := os.Create(file + ".allocs"); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(a, 0)
			a.Close()
		}
	}()
	run := brokercmd.Run
	if kind == "__agent" {
		run = agentcmd.Run
	}
	return run(ctx, args, os.Getenv, os.Stdout, os.Stderr)
}

// profile runs Switchyard once more in front of the overhead engines, with
// the broker and one agent under a CPU profile, at 64 streams, and writes
// where their time goes.
func (e *env) profile(d *doc, engines []string, specs []engineSpec, dur time.Duration) error {
	sy, err := e.switchyard("prof", engines, specs, "on", "--slow-start", "0")
	if err != nil {
		return err
	}
	cfg := loadgen.Config{
		URL: sy.url, Model: model, Concurrency: 64, Seed: 1, Duration: dur, WarmupDuration: time.Second,
		PromptTokens: loadgen.Fixed(16), MaxTokens: loadgen.Fixed(32), Timeout: 60 * time.Second,
	}
	e.logf("profile: Switchyard at 64 streams under pprof")
	t0, c0 := time.Now(), []float64{cpuSeconds(sy.pids()[:1]), cpuSeconds(sy.pids()[1:2])}
	rep, _, err := e.load(cfg, false)
	if err != nil {
		return err
	}
	el := time.Since(t0).Seconds()
	c1 := []float64{cpuSeconds(sy.pids()[:1]), cpuSeconds(sy.pids()[1:2])}
	if err := sy.stop(); err != nil {
		return err
	}
	tokens := rep.OutputTokensPerS * el
	var b strings.Builder
	fmt.Fprintf(&b, "## Where Switchyard's time goes (CPU profile)\n\n")
	fmt.Fprintf(&b, "A separate pass: the broker and the first of the two agents run the real `brokercmd.Run` / `agentcmd.Run` inside this program re-executed under `runtime/pprof` "+
		"(there is no pprof endpoint), at 64 streams for %s (%s output tokens/s, TTFT p50 %s, p99 %s). "+
		"Broker: %.2f cores, %.1f µs of CPU per token; agent (half of the tokens): %.2f cores, %.1f µs per token it relayed.\n\n",
		dur, fmtInt(rep.OutputTokensPerS), fmtMS(rep.TTFT.P50), fmtMS(rep.TTFT.P99),
		(c1[0]-c0[0])/el, 1e6*(c1[0]-c0[0])/tokens, (c1[1]-c0[1])/el, 1e6*(c1[1]-c0[1])/(tokens/2))
	for i, who := range []string{"broker (with its embedded NATS server)", "agent"} {
		rows, total, err := pprofTop(sy.prof[i])
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "**%s**, %.2f s of samples, flat time by area:\n\n", who, total)
		fmt.Fprintf(&b, "| area | share of CPU |\n|---|---|\n")
		for _, a := range byArea(rows, total) {
			fmt.Fprintf(&b, "| %s | %.1f%% |\n", a.name, a.pct)
		}
		fmt.Fprintf(&b, "\nPaths (cumulative: the function and what it calls):\n\n| path | function | cum |\n|---|---|---|\n")
		for _, p := range paths {
			best := pprofRow{}
			for _, r := range rows {
				if strings.Contains(r.fn, p.fn) && r.cum > best.cum {
					best = r
				}
			}
			if best.cum > 0 {
				fmt.Fprintf(&b, "| %s | `%s` | %.1f%% |\n", p.label, best.fn, 100*best.cum/total)
			}
		}
		fmt.Fprintf(&b, "\nTop functions (flat):\n\n| function | flat | cum |\n|---|---|---|\n")
		for _, r := range rows[:min(12, len(rows))] {
			fmt.Fprintf(&b, "| `%s` | %.1f%% | %.1f%% |\n", r.fn, 100*r.flat/total, 100*r.cum/total)
		}
		fmt.Fprintf(&b, "\n")
		d.profiles = append(d.profiles, pathSummary(who, rows, total))
	}
	d.add(b.String())
	return nil
}

type pprofRow struct {
	fn        string
	flat, cum float64 // seconds
}

// pprofTop reads `go tool pprof -top` of a profile.
func pprofTop(file string) ([]pprofRow, float64, error) {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=100000", file).CombinedOutput()
	if err != nil {
		return nil, 0, fmt.Errorf("go tool pprof %s: %w\n%s", file, err, out)
	}
	var rows []pprofRow
	var total float64
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if strings.Contains(line, "samples =") || strings.HasPrefix(strings.TrimSpace(line), "Duration:") {
			// "Duration: 9.01s, Total samples = 10.2s (113.25%)"
			if i := strings.Index(line, "Total samples = "); i >= 0 {
				v := strings.Fields(line[i+len("Total samples = "):])[0]
				total = seconds(v)
			}
			continue
		}
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") || !strings.HasSuffix(f[4], "%") {
			continue
		}
		rows = append(rows, pprofRow{fn: strings.Join(f[5:], " "), flat: seconds(f[0]), cum: seconds(f[3])})
	}
	if total == 0 {
		for _, r := range rows {
			total += r.flat
		}
	}
	if total == 0 {
		return nil, 0, fmt.Errorf("%s: empty profile", file)
	}
	return rows, total, nil
}

func seconds(v string) float64 {
	mult := 1.0
	switch {
	case strings.HasSuffix(v, "ms"):
		mult, v = 1e-3, strings.TrimSuffix(v, "ms")
	case strings.HasSuffix(v, "us"), strings.HasSuffix(v, "µs"):
		mult, v = 1e-6, strings.TrimSuffix(strings.TrimSuffix(v, "us"), "µs")
	case strings.HasSuffix(v, "min"):
		mult, v = 60, strings.TrimSuffix(v, "min")
	case strings.HasSuffix(v, "s"):
		v = strings.TrimSuffix(v, "s")
	}
	x, _ := strconv.ParseFloat(v, 64)
	return x * mult
}

// paths are the call paths worth naming in either profile.
var paths = []struct{ label, fn string }{
	{"HTTP ingress, per request", "openaihttp.(*Server).ServeHTTP"},
	{"SSE flush (one write(2) per burst of waiting chunks)", "net/http.(*ResponseController).Flush"},
	{"JetStream pull consumer walking its waiting pull requests", "server.(*consumer).processWaiting"},
	{"… of which subject-interest checks", "server.(*Sublist).hasInterest"},
	{"NATS server reading clients (agents' chunks, pulls, acks)", "server.(*client).readLoop"},
	{"JetStream storing jobs", "server.(*stream).processJetStreamMsg"},
	{"broker reply demultiplexing", "broker.(*Broker).onReply"},
	{"nats.go read loop", "(*Conn).readLoop"},
	{"agent: job handling", "agent.(*Agent).handle"},
	{"agent: reading the engine's SSE", "openai.readSSE"},
	{"JSON decoding (encoding/json: engine chunks, heartbeats, stop lists)", "encoding/json.Unmarshal"},
	{"broker: validating request bodies (oaiformat.Read)", "oaiformat.Read"},
	{"broker: publishing jobs (one message, its ack to the broker's inbox)", "broker.(*Call).publish"},
	{"agent: reading engine chunks (encoding/json)", "oaiformat.ReadChunk"},
	{"agent: publishing chunks", "agent.(*stream).emit"},
	{"agent: pulling jobs (one batched pull per agent)", "(*pullConsumer).fetch"},
	{"garbage collector", "runtime.gcBgMarkWorker"},
}

type area struct {
	name string
	pct  float64
}

// areas classify a function by name, first match wins.
var areas = []struct{ name, prefixes string }{
	{"syscalls (socket read/write, epoll, futex)", "syscall.|internal/runtime/syscall|runtime/internal/syscall|runtime.futex|runtime.netpoll|runtime.epollwait|runtime.usleep|runtime.nanotime|internal/poll."},
	{"Go scheduler (goroutine park/wake, idle spinning)", "runtime.schedule|runtime.findRunnable|runtime.stealWork|runtime.park|runtime.ready|runtime.goready|runtime.mcall|runtime.gopark|runtime.runqgrab|runtime.lock|runtime.unlock|runtime.casgstatus|runtime.procyield|runtime.osyield|runtime.wakep|runtime.notewakeup|runtime.notesleep|runtime.startm|runtime.stopm|runtime.execute|runtime.checkTimers|runtime.runtimer|runtime.(*timers)|runtime.selectgo|runtime.chan|runtime.send|runtime.recv|runtime.sellock|runtime.selunlock|runtime.gogo|runtime.resetspinning|runtime.exitsyscall|runtime.entersyscall|runtime.reentersyscall"},
	{"GC and allocation", "runtime.mallocgc|runtime.gc|runtime.scanobject|runtime.greyobject|runtime.markroot|runtime.(*mspan)|runtime.(*mcache)|runtime.(*mheap)|runtime.(*gcWork)|runtime.findObject|runtime.heapBits|runtime.memclr|runtime.bgsweep|runtime.sweepone|runtime.wbBuf|runtime.bulkBarrier|runtime.typePointers|runtime.newobject|runtime.makeslice|runtime.growslice|runtime.spanOf|runtime.(*gcBits)|runtime.pageIndexOf|runtime.nextFreeFast|runtime.deductAssistCredit|runtime.(*sweepLocked)|runtime.(*pageAlloc)|runtime.scanblock|runtime.scanstack|runtime.(*mSpanStateBox)|runtime.(*gcControllerState)|runtime.gcDrain"},
	{"nats-server (embedded)", "github.com/nats-io/nats-server/"},
	{"nats.go client", "github.com/nats-io/nats.go|github.com/nats-io/nats%2ego"},
	{"protobuf", "google.golang.org/protobuf/"},
	{"net/http and bufio", "net/http.|bufio.|net/textproto.|net.|crypto/"},
	{"JSON", "encoding/json.|github.com/go-json-experiment/"},
	{"Switchyard code", "github.com/switchyard-ai/switchyard/"},
	{"Prometheus", "github.com/prometheus/"},
	{"other runtime (memmove, maps, strings, hashing)", "runtime.|internal/|strings.|bytes.|strconv.|sync.|fmt.|unicode/|hash/|sort.|slices.|time.|math/|context.|reflect.|errors."},
}

func byArea(rows []pprofRow, total float64) []area {
	sum := map[string]float64{}
	for _, r := range rows {
		name := "other"
		for _, a := range areas {
			for p := range strings.SplitSeq(a.prefixes, "|") {
				if strings.HasPrefix(r.fn, p) {
					name = a.name
					break
				}
			}
			if name != "other" {
				break
			}
		}
		sum[name] += r.flat
	}
	var out []area
	for n, v := range sum {
		out = append(out, area{n, 100 * v / total})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pct > out[j].pct })
	return out
}

// pathSummary names the three costliest specific paths (not the umbrella
// ones that contain the others).
func pathSummary(who string, rows []pprofRow, total float64) string {
	type hit struct {
		label string
		pct   float64
	}
	var hits []hit
	for _, p := range paths {
		if strings.HasPrefix(p.label, "HTTP ingress") || strings.HasSuffix(p.label, "job handling") || strings.HasPrefix(p.label, "…") {
			continue
		}
		best := 0.0
		for _, r := range rows {
			if strings.Contains(r.fn, p.fn) {
				best = max(best, r.cum)
			}
		}
		if best > 0 {
			hits = append(hits, hit{strings.TrimPrefix(p.label, "agent: "), 100 * best / total})
		}
	}
	sort.Slice(hits, func(i, j int) bool { return hits[i].pct > hits[j].pct })
	var parts []string
	for _, h := range hits[:min(3, len(hits))] {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", h.label, h.pct))
	}
	return who + ": " + strings.Join(parts, ", ")
}
