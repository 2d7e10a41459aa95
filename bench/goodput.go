package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-ai/switchyard/oaiformat/sse"
)

// The goodput scenario's service targets: a request is good when its
// time to first token and its time per output token after the first are
// within them; a rate is sustained when goodFraction of its requests are.
const (
	goodTTFT     = 2 * time.Second
	goodTPOT     = 20 * time.Millisecond
	goodFraction = 0.9
)

// goodputFleet is one step of a rollout from regular to PD.
type goodputFleet struct{ regular, prefill, decode int }

// oneRoute reports whether f has only one route, regular or PD, so that
// every dispatch mode sends everything there.
func (f goodputFleet) oneRoute() bool { return f.regular == 0 || f.prefill == 0 }

func (f goodputFleet) String() string {
	if f.prefill == 0 && f.decode == 0 {
		return fmt.Sprintf("%d regular", f.regular)
	}
	return fmt.Sprintf("%d+%dP+%dD", f.regular, f.prefill, f.decode)
}

// goodputResult is one fleet and mode's sweep: its goodput and every
// rate it measured, in the order measured.
type goodputResult struct {
	goodput float64
	points  []goodputPoint
}

// goodputPoint is one rate's window: how many requests were sent, met
// both targets, and failed outright (an error status or error event, or
// no answer), and how busy the machine's CPUs were meanwhile.
type goodputPoint struct {
	rate             float64
	sent, good, fail int
	busy             float64
}

func (p goodputPoint) attainment() float64 {
	if p.sent == 0 {
		return 0
	}
	return float64(p.good) / float64(p.sent)
}

func (r goodputResult) describe() string {
	pts := slices.Clone(r.points)
	slices.SortFunc(pts, func(a, b goodputPoint) int { return cmp.Compare(a.rate, b.rate) })
	var parts []string
	for _, p := range pts {
		parts = append(parts, fmt.Sprintf("%g: %.1f%% (%d; %.0f%%)", p.rate, p.attainment()*100, p.fail, p.busy*100))
	}
	return strings.Join(parts, ", ")
}

// goodputProcs is a running fleet of the scenario: its broker and each
// agent's engine and worker-agent processes.
type goodputProcs struct {
	e               *env
	br              *brokerProc
	agents, engines map[string]*proc
	slots           int
}

// goodputBroker starts a broker dispatching by mode with the scenario's
// targets, with brokerArgs after them, for agents and engines of slots.
func (e *env) goodputBroker(mode string, slots int, brokerArgs ...string) (*goodputProcs, error) {
	br, err := e.startBroker("broker-goodput-"+mode, "", append([]string{"--dispatch-mode", mode,
		"--slo-ttft", goodTTFT.String(), "--slo-itl", goodTPOT.String()}, brokerArgs...)...)
	if err != nil {
		return nil, err
	}
	return &goodputProcs{e: e, br: br, agents: map[string]*proc{}, engines: map[string]*proc{}, slots: slots}, nil
}

// add starts a batch-model engine in role (regular, prefill or decode)
// with engineArgs, and its agent with agentArgs; it does not wait for the
// engine to load.
func (g *goodputProcs) add(id, role string, engineArgs, agentArgs []string) error {
	e := g.e
	p, err := e.sup.start("goodput-engine-"+id, e.path("sim-engine"), append([]string{"--listen", "127.0.0.1:0", "--model", model, "--batch-model",
		"--slots", strconv.Itoa(g.slots), "--role", role, "--pd-protocol", "vllm", "--bootstrap-port", "0", "--log-level", "info"}, engineArgs...)...)
	if err != nil {
		return err
	}
	g.engines[id] = p
	m, err := p.waitFor(e.ctx, engineAddr, 20*time.Second)
	if err != nil {
		return err
	}
	args := append([]string{"--engine-url", "http://" + m[1], "--slots", strconv.Itoa(g.slots)}, agentArgs...)
	switch role {
	case "regular":
		args = append(args, "--engine", "openai")
	case "prefill":
		bs := bootstrapAddr.FindStringSubmatch(p.tail(20))
		if bs == nil {
			return fmt.Errorf("engine %s: no bootstrap address in its log", id)
		}
		args = append(args, "--engine", "vllm", "--role", "prefill", "--bootstrap-host", "127.0.0.1", "--bootstrap-port", bs[1])
	case "decode":
		args = append(args, "--engine", "vllm", "--role", "decode")
	}
	a, err := e.startAgent(id, g.br.NATS, "", args...)
	if err != nil {
		return err
	}
	g.agents[id] = a
	return nil
}

// machineCPU reads the machine's busy and total CPU time from
// /proc/stat, in clock ticks; zeros where there is none.
func machineCPU() (busy, all int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all
}

// goodputRequest streams one request and reports whether it met the
// targets, TTFT <= goodTTFT and mean time per output token after the
// first <= goodTPOT, and whether it failed: an error status or event, or
// no complete answer.
func goodputRequest(ctx context.Context, c *http.Client, base string, w goodputReq) (met, failed bool) {
	body, err := w.body()
	if err != nil {
		return false, true
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return false, true
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return false, true
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return false, true
	}
	var first, last time.Time
	tokens := 0
	events := sse.NewReader(resp.Body, maxSSEEvent)
	for {
		e, err := events.Next()
		if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && string(e.Data) == "[DONE]") {
			break
		}
		payload := string(e.Data)
		switch {
		case payload == "[DONE]":
			if tokens == 0 {
				return false, true
			}
			if first.Sub(sent) > goodTTFT {
				return false, false
			}
			return tokens < 2 || last.Sub(first)/time.Duration(tokens-1) <= goodTPOT, false
		case strings.HasPrefix(payload, `{"error"`):
			return false, true
		case strings.Contains(payload, `"content":"`) && !strings.Contains(payload, `"content":""`):
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			last = now
			tokens++
		}
	}
	return false, true
}
