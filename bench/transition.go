package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/wire"
)

// transition runs the rollout of e2e/transition_test.go with agents as
// separate processes: 4 regular agents under steady streaming load, then
// prefill/decode pairs join, the regular agents drain, they come back and
// the PD agents drain, once per dispatch mode.
func (e *env) transition(d *doc) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## Regular to prefill/decode transition\n\n")
	fmt.Fprintf(&b, "The rollout of `e2e/transition_test.go`, every party its own process: a broker (`--slow-start 2s`) and worker-agents with the in-process simulator "+
		"(`--engine sim --pd-protocol vllm --slots 4 --sim-ttft 2ms --sim-itl 4ms`, roles regular, prefill and decode). "+
		"10 closed-loop streaming clients (12 output tokens) run throughout; each request's route is the `x-switchyard-route` response header. "+
		"A phase's \"dispatcher share\" is the mean of the PD share the broker publishes on `GET /v1/fleet`, sampled every 50 ms; "+
		"peak active is the highest `active` an agent reported in its heartbeats (`sy.hb.>`, read with nats.go from the broker's embedded NATS).\n\n")
	for _, mode := range []string{"count", "capacity"} {
		e.logf("transition: dispatch mode %s", mode)
		if err := e.transitionRun(&b, mode); err != nil {
			return fmt.Errorf("transition %s: %w", mode, err)
		}
	}
	d.add(b.String())
	return nil
}

type startedReq struct {
	at    time.Time
	route string
	err   string
}

func (e *env) transitionRun(b *strings.Builder, mode string) error {
	const slots = 4
	ramp := 2 * time.Second
	scale := 1.0
	if e.quick {
		scale = 0.5
	}
	step := func(s float64) time.Duration { return time.Duration(s * scale * float64(time.Second)) }
	br, err := e.startBroker("broker-pd-"+mode, "", "--dispatch-mode", mode, "--slow-start", ramp.String())
	if err != nil {
		return err
	}
	defer br.stop(10 * time.Second)
	agents := map[string]*proc{}
	add := func(id, role string) error {
		p, err := e.startAgent(mode+"-"+id, br.NATS, "", "--engine", "sim", "--role", role, "--pd-protocol", "vllm",
			"--slots", fmt.Sprint(slots), "--sim-ttft", "2ms", "--sim-itl", "4ms")
		agents[id] = p
		return err
	}
	var drainErrs []string
	drain := func(id string) {
		if err := agents[id].stop(20 * time.Second); err != nil {
			drainErrs = append(drainErrs, fmt.Sprintf("%s: %v", id, err))
		}
	}
	for i := 1; i <= 4; i++ {
		if err := add(fmt.Sprintf("r%d", i), "regular"); err != nil {
			return err
		}
	}
	if err := e.waitEligible(br.HTTP, mode+"-r1", mode+"-r2", mode+"-r3", mode+"-r4"); err != nil {
		return err
	}
	time.Sleep(ramp)

	// Heartbeat peaks.
	nc, err := nats.Connect(br.NATS)
	if err != nil {
		return err
	}
	defer nc.Close()
	var hbMu sync.Mutex
	peak, slotsOf := map[string]int{}, map[string]int{}
	if _, err := nc.Subscribe("sy.hb.>", func(m *nats.Msg) {
		hb, err := wire.UnmarshalHeartbeat(m.Data)
		if err != nil {
			return
		}
		hbMu.Lock()
		id := strings.TrimPrefix(hb.GetAgentId(), mode+"-")
		slotsOf[id] = int(hb.GetSlots())
		peak[id] = max(peak[id], int(hb.GetActive()))
		hbMu.Unlock()
	}); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}

	// Load and dispatcher samples.
	ctx, stopLoad := context.WithCancel(e.ctx)
	defer stopLoad()
	var mu sync.Mutex
	var reqs []startedReq
	type sample struct {
		at    time.Time
		share float64
	}
	var samples []sample
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	defer client.CloseIdleConnections()
	for c := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				at := time.Now()
				route, err := streamOnce(client, br.HTTP, fmt.Sprintf("client %d request %d tell me a story", c, i), 12)
				if ctx.Err() != nil {
					return // cut by the end of the run, not a failure
				}
				s := startedReq{at: at, route: route}
				if err != nil {
					s.err = err.Error()
				}
				mu.Lock()
				reqs = append(reqs, s)
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			f, err := getFleet(ctx, br.HTTP)
			if err == nil && len(f.Models) > 0 {
				mu.Lock()
				samples = append(samples, sample{time.Now(), f.Models[0].Share["pd"]})
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	type phase struct {
		name string
		at   time.Time
	}
	var phases []phase
	mark := func(name string) { phases = append(phases, phase{name, time.Now()}) }
	must := func(err error) {
		if err != nil && len(drainErrs) < 20 {
			drainErrs = append(drainErrs, err.Error())
		}
	}
	mark("4 regular")
	time.Sleep(step(2))
	mark("+1P +1D")
	must(add("p1", "prefill"))
	must(add("d1", "decode"))
	time.Sleep(step(3))
	mark("+2P +2D")
	for _, id := range []string{"p2", "p3"} {
		must(add(id, "prefill"))
	}
	for _, id := range []string{"d2", "d3"} {
		must(add(id, "decode"))
	}
	time.Sleep(step(3))
	for i := 1; i <= 4; i++ {
		mark(fmt.Sprintf("drain r%d", i))
		drain(fmt.Sprintf("r%d", i))
		time.Sleep(step(1))
	}
	mark("PD only")
	time.Sleep(step(2))
	mark("4 regular back")
	for i := 5; i <= 8; i++ {
		must(add(fmt.Sprintf("r%d", i), "regular"))
	}
	time.Sleep(step(3))
	mark("drain prefill")
	for _, id := range []string{"p1", "p2", "p3"} {
		drain(id)
	}
	// Decode legs already handed off still need their decode agent.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		f, err := getFleet(e.ctx, br.HTTP)
		busy := err != nil
		for _, a := range f.Agents {
			busy = busy || (a.Pool == "decode" && a.Active > 0)
		}
		if len(f.Models) > 0 && f.Models[0].Queue["decode"] > 0 {
			busy = true
		}
		if !busy {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mark("drain decode")
	for _, id := range []string{"d1", "d2", "d3"} {
		drain(id)
	}
	time.Sleep(step(1))
	mark("end")
	stopLoad()
	wg.Wait()
	if e.ctx.Err() != nil {
		return e.ctx.Err()
	}

	failed := 0
	var firstErrs []string
	for _, r := range reqs {
		if r.err != "" {
			failed++
			if len(firstErrs) < 3 {
				firstErrs = append(firstErrs, r.err)
			}
		}
	}
	fmt.Fprintf(b, "### `--dispatch-mode %s`\n\n", mode)
	fmt.Fprintf(b, "| phase | duration | requests | PD observed | dispatcher PD share | failed |\n|---|---|---|---|---|---|\n")
	for i := 0; i+1 < len(phases); i++ {
		from, to := phases[i].at, phases[i+1].at
		n, pd, bad := 0, 0, 0
		for _, r := range reqs {
			if !r.at.Before(from) && r.at.Before(to) {
				n++
				if r.route == "pd" {
					pd++
				}
				if r.err != "" {
					bad++
				}
			}
		}
		sum, k := 0.0, 0
		for _, s := range samples {
			if !s.at.Before(from) && s.at.Before(to) {
				sum += s.share
				k++
			}
		}
		obs, share := "–", "–"
		if n > 0 {
			obs = fmt.Sprintf("%.2f", float64(pd)/float64(n))
		}
		if k > 0 {
			share = fmt.Sprintf("%.2f", sum/float64(k))
		}
		fmt.Fprintf(b, "| %s | %.1f s | %d | %s | %s | %d |\n", phases[i].name, to.Sub(from).Seconds(), n, obs, share, bad)
	}
	hbMu.Lock()
	ids := make([]string, 0, len(peak))
	for id := range peak {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		return strings.Compare(poolOrder(a)+a, poolOrder(b)+b)
	})
	var cells []string
	over := 0
	for _, id := range ids {
		cells = append(cells, fmt.Sprintf("%s %d/%d", id, peak[id], slotsOf[id]))
		if peak[id] > slotsOf[id] {
			over++
		}
	}
	hbMu.Unlock()
	fmt.Fprintf(b, "\nFailed requests: **%d of %d**", failed, len(reqs))
	if len(firstErrs) > 0 {
		fmt.Fprintf(b, " (first: %s)", strings.Join(firstErrs, "; "))
	}
	fmt.Fprintf(b, ". Agents above their slots: %d. Peak active / slots per agent: %s.\n", over, strings.Join(cells, ", "))
	if len(drainErrs) > 0 {
		fmt.Fprintf(b, "\nAgent start/drain problems: %s.\n", strings.Join(drainErrs, "; "))
	}
	fmt.Fprintf(b, "\n")
	return nil
}

func poolOrder(id string) string {
	switch id[0] {
	case 'r':
		return "0"
	case 'p':
		return "1"
	}
	return "2"
}

// streamOnce sends one streaming chat request and reads it to the end; it
// returns the route header and an error unless the stream completed.
func streamOnce(c *http.Client, base, prompt string, maxTokens int) (string, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	route := resp.Header.Get("X-Switchyard-Route")
	data, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return route, err
	case resp.StatusCode != http.StatusOK:
		return route, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	case bytes.Contains(data, []byte(`data: {"error"`)):
		return route, fmt.Errorf("error event: %s", tailLines(string(data), 2))
	case !bytes.Contains(data, []byte("data: [DONE]")):
		return route, fmt.Errorf("stream ended without [DONE]")
	}
	return route, nil
}
