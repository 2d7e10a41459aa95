package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/openai"
	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// openStream starts a streaming request and returns once the first token
// arrived, with a func that hangs up.
func openStream(t *testing.T, base, prompt string, maxTokens int) (hangUp func(), rest <-chan streamResult) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"content":" `) {
			break
		}
	}
	out := make(chan streamResult, 1)
	go func() {
		defer resp.Body.Close()
		var r streamResult
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: [DONE]") {
				r.done = true
			}
			if strings.Contains(line, `"error"`) {
				r.errMsg = line
			}
			if err != nil {
				out <- r
				return
			}
		}
	}()
	return cancel, out
}

// TestClientDisconnectCancels: a client that hangs up mid-stream cancels
// the engine request (the engine counts an abort), on the regular route and
// on both legs of the PD route.
func TestClientDisconnectCancels(t *testing.T) {
	t.Run("regular", func(t *testing.T) {
		b := cmdtest.StartBroker(t)
		e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 20 * time.Millisecond, Slots: 4})
		startAgent(t, b.NATS, "a1", e, 4)
		cmdtest.WaitEligible(t, b.HTTP, "a1")
		hangUp, _ := openStream(t, b.HTTP, "a story that will be interrupted", 200)
		at := time.Now()
		hangUp()
		testwait.For(t, 10*time.Second, time.Millisecond, func() error {
			if e.Aborted() == 0 {
				return fmt.Errorf("engine not aborted")
			}
			return nil
		})
		t.Logf("engine aborted %s after the client hung up", time.Since(at).Round(time.Millisecond))
	})
	t.Run("pd sglang", func(t *testing.T) {
		// The decode leg must still be running when the hang-up's cancel
		// reaches it: at 1ms a token it could finish its 200 first on a
		// busy machine, and there would be nothing to abort. 20ms a token,
		// as on the regular route.
		f := startPD(t, "sglang", 20*time.Millisecond)
		hangUp, _ := openStream(t, f.b.HTTP, "a disaggregated story that will be interrupted", 200)
		if f.decode.current.Load() == 0 {
			t.Fatal("the decode leg ended before the hang-up: nothing left to abort")
		}
		at := time.Now()
		hangUp()
		testwait.For(t, 10*time.Second, time.Millisecond, func() error {
			if f.decode.Aborted() == 0 {
				return fmt.Errorf("decode not aborted")
			}
			return nil
		})
		t.Logf("decode leg aborted %s after the client hung up", time.Since(at).Round(time.Millisecond))
	})
}

// holdOnlySlot starts a one-slot agent and a request that keeps its slot
// (a 2.5s prefill) long enough for the queue depth, sampled every second, to
// show what waits behind it.
func holdOnlySlot(t *testing.T, b *cmdtest.Broker) (*engine, <-chan streamResult) {
	t.Helper()
	e := startEngine(t, simengine.Config{Model: model, TTFT: 2500 * time.Millisecond, ITL: time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "one-slot", e, 1)
	cmdtest.WaitEligible(t, b.HTTP, "one-slot")
	first := make(chan streamResult, 1)
	go func() {
		r, _ := rawStream(context.Background(), b.HTTP, "holding the only slot", 5)
		first <- r
	}()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if e.current.Load() == 0 {
			return fmt.Errorf("first request not at the engine")
		}
		return nil
	})
	return e, first
}

// TestCancelledWhileQueued: a request whose client leaves while its job
// still waits in the queue never reaches an engine.
func TestCancelledWhileQueued(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e, first := holdOnlySlot(t, b)
	served := e.served.Load()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = rawStream(ctx, b.HTTP, "queued and abandoned", 5)
	}()
	// Wait until the second job is in the queue, then hang up.
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		f := getFleetFull(t, b.HTTP)
		if len(f.Models) == 0 || f.Models[0].Queue["regular"] == 0 {
			return fmt.Errorf("not queued yet")
		}
		return nil
	})
	cancel()
	<-done
	if r := <-first; !r.done {
		t.Fatalf("first stream: %+v", r)
	}
	// The agent takes the queued job next and must drop it.
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		f := getFleetFull(t, b.HTTP)
		if len(f.Models) > 0 && f.Models[0].Queue["regular"] > 0 {
			return fmt.Errorf("job still queued")
		}
		return nil
	})
	r, err := rawStream(context.Background(), b.HTTP, "after the abandoned one", 3)
	if err != nil || !r.done {
		t.Fatalf("%+v %v", r, err)
	}
	if got := e.served.Load() - served; got != 1 {
		t.Fatalf("engine served %d requests after the first; the abandoned one must not start", got)
	}
}

// TestQueueFull: a full pool queue answers 429 with Retry-After at once.
func TestQueueFull(t *testing.T) {
	b := cmdtest.StartBroker(t, "--queue-max", "1")
	_, first := holdOnlySlot(t, b)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = rawStream(context.Background(), b.HTTP, "waiting in the queue", 3) }()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		f := getFleetFull(t, b.HTTP)
		if len(f.Models) == 0 || f.Models[0].Queue["regular"] == 0 {
			return fmt.Errorf("not queued yet")
		}
		return nil
	})
	resp, err := http.Post(b.HTTP+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"one too many"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	text := readAll(resp)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(text, "queue_full") {
		t.Fatalf("status %d retry-after %q body %s", resp.StatusCode, resp.Header.Get("Retry-After"), text)
	}
	<-first
	wg.Wait()
}

// TestAgentLostBeforeFirstToken: an agent that dies (its NATS connection
// gone, no draining heartbeat) while its engine is still prefilling; the
// broker notices the missing heartbeats and retries on another agent,
// invisibly to the client.
func TestAgentLostBeforeFirstToken(t *testing.T) {
	b := cmdtest.StartBroker(t)
	slow := startEngine(t, simengine.Config{Model: model, TTFT: 5 * time.Second, ITL: time.Millisecond, Slots: 4})
	nc, err := nats.Connect(b.NATS)
	if err != nil {
		t.Fatal(err)
	}
	oa, _ := openai.New(slow.URL, 4)
	doomed, err := agent.New(nc, oa, agent.Config{ID: "doomed", Model: model, Slots: 4, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = doomed.Run(ctx) }()
	cmdtest.WaitEligible(t, b.HTTP, "doomed")
	const prompt = "outlive your agent"
	res := make(chan streamResult, 1)
	go func() {
		r, _ := rawStream(context.Background(), b.HTTP, prompt, 10)
		res <- r
	}()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if slow.current.Load() == 0 {
			return fmt.Errorf("not at the engine yet")
		}
		return nil
	})
	startAgent(t, b.NATS, "survivor", fastEngine(t, 4), 4)
	cmdtest.WaitEligible(t, b.HTTP, "survivor")
	killed := time.Now()
	nc.Close()
	r := <-res
	want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":10}`, prompt))
	if !r.done || r.text != want.Text || r.agent != "survivor" || r.errMsg != "" {
		t.Fatalf("after the agent died: %+v, want %q from survivor", r, want.Text)
	}
	t.Logf("request completed on the survivor %s after its first agent died", time.Since(killed).Round(time.Millisecond))
}

// TestBrokerGracefulShutdown: on SIGTERM the broker refuses new work
// (readyz and requests 503), lets the stream in flight finish, and returns
// nil.
func TestBrokerGracefulShutdown(t *testing.T) {
	b := cmdtest.StartBroker(t, "--shutdown-delay", "1s", "--shutdown-grace", "20s")
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 10 * time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	_, rest := openStream(t, b.HTTP, "finish me during shutdown", 60)
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(t) }()
	testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		resp, err := http.Get(b.HTTP + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	status, _ := post(t, b.HTTP+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"too late"}]}`)
	if status != 503 {
		t.Fatalf("new request during shutdown: %d", status)
	}
	if r := <-rest; !r.done || r.errMsg != "" {
		t.Fatalf("in-flight stream cut by shutdown: %+v", r)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("broker returned %v", err)
	}
}

// TestShutdownPastGrace: a broker stopped with streams still open at the
// end of --shutdown-grace ends each with one clear error: an HTTP stream
// gets an error event with code "shutdown" and [DONE], a gRPC stream
// UNAVAILABLE, and the requests count as outcome shutdown, not as
// cancelled by their clients.
func TestShutdownPastGrace(t *testing.T) {
	b := cmdtest.StartBroker(t, "--shutdown-grace", "500ms", "--log-level", "info")
	// Slow enough that neither answer can end before the grace does.
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 200 * time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	// The simulator ends some answers early: these prompts are ones it
	// answers at length, so both streams are still running when the
	// grace ends.
	long := func(kind string) string {
		for seed := 0; seed < 1000; seed++ {
			p := sloPrompt(kind, seed, 12)
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":5000}`, model, p)
			if expect(t, simengine.APIChat, body).CompletionTokens >= 60 {
				return p
			}
		}
		t.Fatal("no prompt the simulator answers at length")
		return ""
	}
	_, httpRest := openStream(t, b.HTTP, long("http"), 5000)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gs, err := grpcClient(t, b.GRPC).Chat(ctx, &switchyardv1.ChatRequest{
		Model: model, Messages: []*switchyardv1.Message{{Role: "user", Content: long("grpc")}}, MaxTokens: ptr(uint32(5000)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gs.Recv(); err != nil { // the stream has started
		t.Fatal(err)
	}
	grpcErr := make(chan error, 1)
	go func() {
		for {
			if _, err := gs.Recv(); err != nil {
				grpcErr <- err
				return
			}
		}
	}()

	if err := b.Stop(t); err != nil {
		t.Fatalf("broker returned %v", err)
	}
	r := <-httpRest
	if !strings.Contains(r.errMsg, `"code":"shutdown"`) || !r.done {
		t.Fatalf("HTTP stream: %+v, want an error event with code shutdown, then [DONE]", r)
	}
	if err := <-grpcErr; status.Code(err) != codes.Unavailable {
		t.Fatalf("gRPC stream ended with %v, want UNAVAILABLE", err)
	}
	log := b.Err.String()
	if n := strings.Count(log, "outcome=shutdown"); n != 2 {
		t.Fatalf("%d requests logged with outcome=shutdown, want 2:\n%s", n, log)
	}
}

// TestTwoBrokers: two brokers serve one fleet on one NATS; stopping one
// hard affects only its own requests.
func TestTwoBrokers(t *testing.T) {
	a := cmdtest.StartBroker(t, "--id", "broker-a")
	other := cmdtest.Start(t, brokerRun, "--http", "127.0.0.1:0", "--grpc", "", "--nats-url", a.NATS, "--id", "broker-b",
		"--heartbeat-interval", "100ms", "--slow-start", "0", "--log-level", "error", "--shutdown-grace", "0s")
	bURL, _, _ := cmdtest.WaitBroker(t, other.Out, other.Exited)
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 10 * time.Millisecond, Slots: 16})
	startAgent(t, a.NATS, "shared", e, 16)
	cmdtest.WaitEligible(t, a.HTTP, "shared")
	cmdtest.WaitEligible(t, bURL, "shared")
	_, viaA := openStream(t, a.HTTP, "served by broker a", 60)
	_, viaB := openStream(t, bURL, "served by broker b", 60)
	_ = other.Stop(t) // grace 0: its streams are cut
	if r := <-viaA; !r.done || r.errMsg != "" {
		t.Fatalf("broker a's stream hurt by broker b's end: %+v", r)
	}
	if r := <-viaB; !strings.Contains(r.errMsg, `"shutdown"`) {
		t.Fatalf("broker b's stream did not end with its shutdown error: %+v", r)
	}
	r, err := rawStream(context.Background(), a.HTTP, "broker a still serves", 4)
	if err != nil || !r.done {
		t.Fatalf("%+v %v", r, err)
	}
}

// TestMigrationAfterFirstToken: the agent dies mid-stream (its NATS
// connection gone); the broker continues the stream on another agent from
// the text already sent, and the client receives exactly the text of an
// uninterrupted request, byte for byte, with usage of one request.
func TestMigrationAfterFirstToken(t *testing.T) {
	// "tools": a stream that may carry half-sent tool calls cannot be
	// continued from its text; it ends with one clear error instead.
	for _, api := range []string{"chat", "completion", "tools"} {
		t.Run(api, func(t *testing.T) {
			b := cmdtest.StartBroker(t)
			slowish := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 40 * time.Millisecond, Slots: 4})
			nc, err := nats.Connect(b.NATS)
			if err != nil {
				t.Fatal(err)
			}
			oa, _ := openai.New(slowish.URL, 4)
			doomed, err := agent.New(nc, oa, agent.Config{ID: "doomed", Model: model, Slots: 4, Heartbeat: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = doomed.Run(ctx) }()
			cmdtest.WaitEligible(t, b.HTTP, "doomed")

			var body, path string
			var want simengine.Expectation
			switch api {
			case "chat", "tools":
				body = `{"model":"sim-model","messages":[{"role":"user","content":"never stop talking"}],"max_tokens":30,"stream":true,"stream_options":{"include_usage":true}}`
				if api == "tools" {
					body = strings.Replace(body, `"max_tokens"`, `"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"max_tokens"`, 1)
				}
				path = "/v1/chat/completions"
				want = expect(t, simengine.APIChat, body)
			default:
				body = `{"model":"sim-model","prompt":"a river runs","max_tokens":30,"stream":true,"stream_options":{"include_usage":true}}`
				path = "/v1/completions"
				want = expect(t, simengine.APICompletion, body)
			}
			survivorEng := fastEngine(t, 4)
			if want.CompletionTokens < 12 {
				t.Fatalf("prompt too short for the test: %d tokens", want.CompletionTokens)
			}
			req, _ := http.NewRequest("POST", b.HTTP+path, strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			var text strings.Builder
			var usage struct{ Prompt, Completion, Total int }
			tokens, done, killed, errors := 0, false, false, 0
			var arrivals []time.Time // the kill, then every event after it
			ids := map[string]bool{}
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					break
				}
				payload, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
				if !ok {
					continue
				}
				if payload == "[DONE]" {
					done = true
					continue
				}
				var c struct {
					ID      string `json:"id"`
					Choices []struct {
						Text  string `json:"text"`
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
					Usage *struct {
						Prompt     int `json:"prompt_tokens"`
						Completion int `json:"completion_tokens"`
						Total      int `json:"total_tokens"`
					} `json:"usage"`
					Error any `json:"error"`
				}
				if err := json.Unmarshal([]byte(payload), &c); err != nil {
					t.Fatal(err)
				}
				if c.Error != nil {
					errors++
				}
				ids[c.ID] = true
				for _, ch := range c.Choices {
					piece := ch.Delta.Content + ch.Text
					text.WriteString(piece)
					if piece != "" {
						tokens++
					}
				}
				if c.Usage != nil {
					usage.Prompt, usage.Completion, usage.Total = c.Usage.Prompt, c.Usage.Completion, c.Usage.Total
				}
				if killed {
					arrivals = append(arrivals, time.Now())
				}
				if tokens >= 3 && !killed {
					killed = true
					startAgent(t, b.NATS, "survivor", survivorEng, 4)
					cmdtest.WaitEligible(t, b.HTTP, "survivor")
					nc.Close() // the agent is gone mid-stream
					arrivals = append(arrivals, time.Now())
				}
			}
			if api == "tools" {
				if !killed || errors != 1 || !strings.HasPrefix(want.Text, text.String()) || text.Len() == len(want.Text) {
					t.Fatalf("killed %v errors %d; text %q must be a strict prefix of %q", killed, errors, text.String(), want.Text)
				}
				if n := survivorEng.served.Load(); n != 0 {
					t.Fatalf("the survivor served %d requests; a stream with tools must not move", n)
				}
				return
			}
			if !killed || !done || errors != 0 {
				t.Fatalf("killed %v done %v errors %d", killed, done, errors)
			}
			if text.String() != want.Text {
				t.Fatalf("migrated stream:\n got %q\nwant %q", text.String(), want.Text)
			}
			if usage.Completion != want.CompletionTokens || usage.Prompt != want.PromptTokens || usage.Total != want.PromptTokens+want.CompletionTokens {
				t.Fatalf("usage %+v, want %d+%d", usage, want.PromptTokens, want.CompletionTokens)
			}
			if len(ids) != 1 {
				t.Fatalf("chunk ids %v: the client must see one stream", ids)
			}
			// The longest silence after the kill is the client's wait for
			// the first token of the migrated attempt.
			var gap time.Duration
			for i := 1; i < len(arrivals); i++ {
				gap = max(gap, arrivals[i].Sub(arrivals[i-1]))
			}
			t.Logf("time to the first token after the migration: %s (heartbeat 100ms)", gap.Round(time.Millisecond))
			if survivorEng.served.Load() != 1 {
				t.Fatalf("the survivor served %d requests; the stream must have moved to it", survivorEng.served.Load())
			}
		})
	}
}

// TestDrainTimeout: an agent told to stop with --drain-timeout ends the
// stream it still serves when the timeout passes, and exits; the broker
// migrates the stream to another agent at once (no heartbeat loss to wait
// for), and the client gets the whole answer, byte for byte.
func TestDrainTimeout(t *testing.T) {
	b := cmdtest.StartBroker(t)
	slow := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 100 * time.Millisecond, Slots: 4})
	old := startAgentCmd(t, b.NATS, "--nats-url", b.NATS, "--engine", "openai", "--engine-url", slow.URL, "--id", "old",
		"--slots", "4", "--heartbeat", liveHeartbeat, "--log-level", "warn", "--drain-timeout", "300ms", "--slow-start", "0")
	cmdtest.WaitEligible(t, b.HTTP, "old")
	const prompt, maxTokens = "a long story about the last train", 40
	want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, prompt, maxTokens))
	if want.CompletionTokens < 20 {
		t.Fatalf("prompt too short for the test: %d tokens", want.CompletionTokens)
	}
	res := make(chan streamResult, 1)
	go func() {
		r, err := rawStream(context.Background(), b.HTTP, prompt, maxTokens)
		if err != nil {
			r.errMsg = err.Error()
		}
		res <- r
	}()
	testwait.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		if slow.served.Load() == 0 {
			return errors.New("the old agent's engine has not been called")
		}
		return nil
	})
	survivor := fastEngine(t, 4)
	startAgent(t, b.NATS, "survivor", survivor, 4)
	cmdtest.WaitEligible(t, b.HTTP, "survivor")
	stopAt := time.Now()
	old.Cancel() // SIGTERM
	var exited time.Duration
	select {
	case <-old.Done():
		exited = time.Since(stopAt)
		if err := old.Result(); err != nil {
			t.Fatalf("old agent: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("old agent still draining 10s after SIGTERM; stderr:\n%s", old.Err.String())
	}
	r := <-res
	if r.status != http.StatusOK || !r.done || r.errMsg != "" {
		t.Fatalf("status %d done %v err %q", r.status, r.done, r.errMsg)
	}
	if r.text != want.Text {
		t.Fatalf("drained stream:\n got %q\nwant %q", r.text, want.Text)
	}
	if survivor.served.Load() != 1 {
		t.Fatalf("the survivor served %d requests; the stream must have moved to it", survivor.served.Load())
	}
	// The survivor's call proves the old agent gave the stream up rather
	// than finishing it (4 s of tokens on its engine).
	t.Logf("old agent exited %s after SIGTERM; stream migrated and complete", exited.Round(time.Millisecond))
}

// TestQueueTimeout: a request no agent takes within --queue-timeout ends
// with 503, and its job never starts later.
func TestQueueTimeout(t *testing.T) {
	b := cmdtest.StartBroker(t, "--queue-timeout", "500ms")
	e, first := holdOnlySlot(t, b)
	served := e.served.Load()
	status, body := post(t, b.HTTP+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"no one takes me"}],"max_tokens":3}`)
	if status != 503 || !strings.Contains(body, "queue_timeout") {
		t.Fatalf("status %d %s", status, body)
	}
	if r := <-first; !r.done {
		t.Fatalf("first: %+v", r)
	}
	r, err := rawStream(context.Background(), b.HTTP, "the next one", 3)
	if err != nil || !r.done {
		t.Fatalf("%+v %v", r, err)
	}
	if got := e.served.Load() - served; got != 1 {
		t.Fatalf("engine served %d after the first; the timed-out job must not start", got)
	}
}
