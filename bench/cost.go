package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/loadgen"
	"github.com/switchyard-ai/switchyard/wire"
)

// dispatchCost runs the dispatch package's benchmarks and tabulates them.
func (e *env) dispatchCost(d *doc) error {
	args := []string{"test", "-run", "^$", "-bench", ".", "./dispatch"}
	if e.quick {
		args = append(args, "-benchtime", "2000x")
	}
	e.logf("dispatch: go %s", strings.Join(args, " "))
	out, err := exec.CommandContext(e.ctx, "go", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Dispatch decision versus fleet size\n\n```sh\ngo %s\n```\n\n", strings.Join(args, " "))
	fmt.Fprintf(&b, "| benchmark | fleet | ns/op | B/op | allocs/op | other |\n|---|---|---|---|---|---|\n")
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name, fleet, _ := strings.Cut(strings.TrimPrefix(f[0], "Benchmark"), "/")
		if i := strings.LastIndexByte(fleet, '-'); i > 0 {
			fleet = fleet[:i]
		}
		units := map[string]string{}
		var other []string
		for i := 2; i+1 < len(f); i += 2 {
			switch f[i+1] {
			case "ns/op", "B/op", "allocs/op":
				units[f[i+1]] = f[i]
			default:
				other = append(other, f[i]+" "+f[i+1])
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", name, strings.ReplaceAll(fleet, "agents=", ""), units["ns/op"], units["B/op"], units["allocs/op"], strings.Join(other, ", "))
	}
	fmt.Fprintf(&b, "\n`Decide` is the per-request decision on a snapshot; `NewModel` rebuilds the snapshot (once per heartbeat burst, at most every 10 ms).\n\n")
	d.add(b.String())
	return nil
}

// memory opens 1,000 slow streams through the broker and reads its RSS.
func (e *env) memory(d *doc) error {
	const streams = 1000
	br, err := e.startBroker("broker-mem", "", "--slow-start", "0", "--queue-max", "4096")
	if err != nil {
		return err
	}
	defer br.stop(10 * time.Second)
	ag, err := e.startAgent("mem-a1", br.NATS, "", "--engine", "sim", "--slots", "1100", "--sim-ttft", "10ms", "--sim-itl", "100ms")
	if err != nil {
		return err
	}
	defer ag.stop(20 * time.Second)
	if err := e.waitEligible(br.HTTP, "mem-a1"); err != nil {
		return err
	}
	nc, err := nats.Connect(br.NATS)
	if err != nil {
		return err
	}
	defer nc.Close()
	var mu sync.Mutex
	peakActive := 0
	if _, err := nc.Subscribe("sy.hb.>", func(m *nats.Msg) {
		if hb, err := wire.UnmarshalHeartbeat(m.Data); err == nil {
			mu.Lock()
			peakActive = max(peakActive, int(hb.GetActive()))
			mu.Unlock()
		}
	}); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	idle, err := rssKB(br.pid())
	if err != nil {
		return err
	}
	dur := 8 * time.Second
	if e.quick {
		dur = 4 * time.Second
	}
	tokens := 100 // 10 s per stream at 100 ms per token: every stream stays open through the window
	cfg := loadgen.Config{
		URL: br.HTTP, Model: model, Concurrency: streams, Seed: 3, Duration: dur,
		PromptTokens: loadgen.Fixed(16), MaxTokens: loadgen.Fixed(tokens), Timeout: 60 * time.Second,
	}
	e.logf("memory: %d concurrent streams through the broker", streams)
	sctx, stop := context.WithCancel(e.ctx)
	peakRSS := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sctx.Err() == nil {
			if kb, err := rssKB(br.pid()); err == nil {
				peakRSS = max(peakRSS, kb)
			}
			select {
			case <-sctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	rep, _, err := e.load(cfg, false)
	stop()
	wg.Wait()
	if err != nil {
		return err
	}
	mu.Lock()
	pa := peakActive
	mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "## Broker memory at %d concurrent streams\n\n", streams)
	fmt.Fprintf(&b, "A broker on embedded NATS (jobs stream in memory, the default) and one agent with the in-process simulator (`--slots 1100`, 100 ms per token), %d closed-loop streams of up to %d tokens (about 10 s each) for %s. "+
		"RSS is VmRSS of the broker process from /proc/<pid>/status, sampled every 100 ms; the broker process includes the embedded NATS server.\n\n", streams, tokens, dur)
	fmt.Fprintf(&b, "| broker RSS idle | broker RSS peak | added per open stream | peak active jobs (agent heartbeat) | requests finished | errors |\n|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %.1f MiB | %.1f MiB | %.1f KiB | %d | %d | %d |\n\n", float64(idle)/1024, float64(peakRSS)/1024,
		float64(peakRSS-idle)/float64(max(pa, 1)), pa, rep.Requests, errCount(rep))
	d.add(b.String())
	return nil
}
