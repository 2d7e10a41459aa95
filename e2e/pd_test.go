package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/simengine"
)

type pdFleet struct {
	b               *cmdtest.Broker
	prefill, decode *engine
}

// startPD runs a broker with one prefill and one decode agent, each in
// front of a sim-engine of that role with inter-token latency itl,
// speaking protocol over HTTP.
func startPD(t *testing.T, protocol string, itl time.Duration) *pdFleet {
	t.Helper()
	b := cmdtest.StartBroker(t)
	cfg := func(role simengine.Role) simengine.Config {
		return simengine.Config{Model: model, TTFT: time.Millisecond, ITL: itl, Slots: 4,
			Role: role, PDProtocol: simengine.PDProtocol(protocol), BootstrapTimeout: 5 * time.Second}
	}
	p := startEngine(t, cfg(simengine.RolePrefill))
	d := startEngine(t, cfg(simengine.RoleDecode))
	startAgent(t, b.NATS, "pre", p, 4, "--engine", protocol, "--role", "prefill",
		"--bootstrap-host", "127.0.0.1", "--bootstrap-port", fmt.Sprint(p.BootstrapPort()))
	startAgent(t, b.NATS, "dec", d, 4, "--engine", protocol, "--role", "decode")
	cmdtest.WaitEligible(t, b.HTTP, "pre", "dec")
	return &pdFleet{b: b, prefill: p, decode: d}
}

// TestPDProtocols: PD requests over both protocols return exactly what a
// regular engine returns for the same request.
func TestPDProtocols(t *testing.T) {
	for _, protocol := range []string{"vllm", "sglang"} {
		t.Run(protocol, func(t *testing.T) {
			f := startPD(t, protocol, time.Millisecond)
			client := sdk(f.b.HTTP)
			ctx := context.Background()
			for i := range 3 {
				prompt := fmt.Sprintf("disaggregated request %d", i)
				want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":10}`, prompt))
				var resp *http.Response
				got, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
					Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}, MaxTokens: openai.Int(10),
				}, withResponse(&resp))
				if err != nil {
					t.Fatal(err)
				}
				if got.Choices[0].Message.Content != want.Text || got.Usage.CompletionTokens != int64(want.CompletionTokens) {
					t.Fatalf("got %q (%d tokens), want %q (%d)", got.Choices[0].Message.Content, got.Usage.CompletionTokens, want.Text, want.CompletionTokens)
				}
				if resp.Header.Get("X-Switchyard-Route") != "pd" || resp.Header.Get("X-Switchyard-Agent") != "pre,dec" {
					t.Fatalf("headers route %q agent %q", resp.Header.Get("X-Switchyard-Route"), resp.Header.Get("X-Switchyard-Agent"))
				}
			}
			r, err := rawStream(ctx, f.b.HTTP, "a streamed PD answer", 16)
			want := expect(t, simengine.APIChat, `{"messages":[{"role":"user","content":"a streamed PD answer"}],"max_tokens":16}`)
			if err != nil || !r.done || r.text != want.Text {
				t.Fatalf("stream %+v %v, want %q", r, err, want.Text)
			}
			comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
				Model: model, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("prefill then decode")}, MaxTokens: openai.Int(6),
			})
			wantC := expect(t, simengine.APICompletion, `{"prompt":"prefill then decode","max_tokens":6}`)
			if err != nil || comp.Choices[0].Text != wantC.Text {
				t.Fatalf("completion %v %v, want %q", comp, err, wantC.Text)
			}
			if f.prefill.served.Load() == 0 || f.decode.served.Load() == 0 {
				t.Fatal("a leg's engine was never called")
			}
		})
	}
}

// TestPDBrokenLeg: with a leg's engine down, a PD request ends promptly with
// one clear error instead of waiting for a bootstrap or request timeout.
func TestPDBrokenLeg(t *testing.T) {
	for _, protocol := range []string{"vllm", "sglang"} {
		for _, leg := range []string{"prefill", "decode"} {
			t.Run(protocol+"/"+leg+" down", func(t *testing.T) {
				f := startPD(t, protocol, time.Millisecond)
				if leg == "prefill" {
					f.prefill.Stop()
				} else {
					f.decode.Stop()
				}
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				defer cancel()
				for _, stream := range []bool{false, true} {
					body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"doomed"}],"max_tokens":8,"stream":%v}`, model, stream)
					req, _ := http.NewRequestWithContext(ctx, "POST", f.b.HTTP+"/v1/chat/completions", strings.NewReader(body))
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatalf("stream=%v: %v (a hang ends in the 4s context)", stream, err)
					}
					text := readAll(resp)
					resp.Body.Close()
					if resp.StatusCode < 500 || !strings.Contains(text, `"error"`) {
						t.Fatalf("stream=%v: status %d body %s", stream, resp.StatusCode, text)
					}
					if !strings.Contains(text, leg) && !strings.Contains(text, "engine") {
						t.Fatalf("stream=%v: error does not say what failed: %s", stream, text)
					}
				}
			})
		}
	}
}
