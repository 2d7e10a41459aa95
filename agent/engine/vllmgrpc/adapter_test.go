package vllmgrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/wire"
)

// startSim serves a simulator's gRPC service on 127.0.0.1:0.
func startSim(t testing.TB, cfg simengine.Config) (*simengine.Engine, string) {
	t.Helper()
	e, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := e.GRPCServer()
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return e, ln.Addr().String()
}

func simConfig() simengine.Config {
	c := simengine.DefaultConfig()
	c.TTFT, c.ITL, c.Slots = 0, 0, 4
	c.BootstrapHost, c.BootstrapPort = "127.0.0.1", 0
	return c
}

func newAdapter(t testing.TB, addr string, opts ...Option) *Adapter {
	t.Helper()
	a, err := New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// collected is what an OpenAI stream carried.
type collected struct {
	text      string
	deltas    int
	role      bool
	finish    string
	usage     *struct{ PromptTokens, CompletionTokens, TotalTokens int }
	afterDone bool // a chunk after the usage chunk
}

func collect(t testing.TB, api wire.API) (*collected, agent.Emit) {
	c := &collected{}
	return c, func(raw []byte, _ bool) error {
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				TotalTokens      int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(raw, &ch); err != nil {
			t.Errorf("chunk %s: %v", raw, err)
			return err
		}
		want := "text_completion"
		if api == wire.API_API_CHAT {
			want = "chat.completion.chunk"
		}
		if ch.Object != want {
			t.Errorf("object %q, want %q", ch.Object, want)
		}
		if c.usage != nil {
			c.afterDone = true
		}
		if len(ch.Choices) == 0 {
			if ch.Usage == nil {
				t.Errorf("chunk without choices or usage: %s", raw)
			}
			u := *ch.Usage
			c.usage = &struct{ PromptTokens, CompletionTokens, TotalTokens int }{u.PromptTokens, u.CompletionTokens, u.TotalTokens}
			return nil
		}
		x := ch.Choices[0]
		if x.Delta != nil {
			if x.Delta.Role == "assistant" {
				c.role = true
			}
			if x.Delta.Content != nil && *x.Delta.Content != "" {
				c.text += *x.Delta.Content
				c.deltas++
			}
		}
		if x.Text != nil && *x.Text != "" {
			c.text += *x.Text
			c.deltas++
		}
		if x.FinishReason != nil {
			c.finish = *x.FinishReason
		}
		return nil
	}
}

func (c *collected) matches(t testing.TB, api wire.API, body string) {
	t.Helper()
	sapi := simengine.APIChat
	if api == wire.API_API_COMPLETION {
		sapi = simengine.APICompletion
	}
	x, err := simengine.Expect(sapi, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if c.text != x.Text || c.finish != x.FinishReason {
		t.Errorf("text %q finish %q, want %q %q", c.text, c.finish, x.Text, x.FinishReason)
	}
	if c.usage == nil || c.usage.PromptTokens != x.PromptTokens || c.usage.CompletionTokens != x.CompletionTokens ||
		c.usage.TotalTokens != x.PromptTokens+x.CompletionTokens {
		t.Errorf("usage %+v, want %d/%d", c.usage, x.PromptTokens, x.CompletionTokens)
	}
	if api == wire.API_API_CHAT && !c.role {
		t.Error("no role chunk")
	}
	if c.afterDone {
		t.Error("a chunk after the usage chunk")
	}
}

func request(api wire.API, body string) *agent.Request {
	return &agent.Request{RequestID: "req-1", API: api, Body: []byte(body), Job: &wire.Job{RequestId: "req-1", Model: "sim-model"}}
}

func TestStreamMatchesSimulator(t *testing.T) {
	_, addr := startSim(t, simConfig())
	a := newAdapter(t, addr)
	for _, tc := range []struct {
		name string
		api  wire.API
		body string
	}{
		{"chat", wire.API_API_CHAT, `{"model":"sim-model","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Tell me a story"}],"max_tokens":30,"stream":true}`},
		{"chat parts", wire.API_API_CHAT, `{"messages":[{"role":"user","content":[{"type":"text","text":"a "},{"type":"text","text":"b"}]}],"max_completion_tokens":12}`},
		{"chat continue", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"the way"}],"continue_final_message":true,"max_tokens":9}`},
		{"chat long", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"go on"}],"max_tokens":300,"temperature":0.7,"top_p":0.9,"seed":7}`},
		{"completion", wire.API_API_COMPLETION, `{"model":"sim-model","prompt":"Once upon a time","max_tokens":25}`},
		{"completion list", wire.API_API_COMPLETION, `{"prompt":["the quick brown fox"],"max_tokens":40}`},
		{"completion stop", wire.API_API_COMPLETION, `{"prompt":"Once upon a time","max_tokens":60,"stop":["e","zz"]}`},
		{"chat stop", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"x"}],"max_tokens":60,"stop":"th"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, emit := collect(t, tc.api)
			if err := a.Stream(t.Context(), request(tc.api, tc.body), emit); err != nil {
				t.Fatal(err)
			}
			c.matches(t, tc.api, tc.body)
		})
	}
}

func TestStreamTokenizerFile(t *testing.T) {
	_, addr := startSim(t, simConfig())
	js, err := simengine.SimTokenizer().MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tok.json")
	if err := os.WriteFile(path, js, 0o600); err != nil {
		t.Fatal(err)
	}
	a := newAdapter(t, addr, WithTokenizerFile(path))
	body := `{"prompt":"Once upon a time","max_tokens":25}`
	c, emit := collect(t, wire.API_API_COMPLETION)
	if err := a.Stream(t.Context(), request(wire.API_API_COMPLETION, body), emit); err != nil {
		t.Fatal(err)
	}
	c.matches(t, wire.API_API_COMPLETION, body)

	if _, err := New(addr, WithTokenizerFile(filepath.Join(t.TempDir(), "missing.json"))); err == nil {
		t.Fatal("missing tokenizer file: no error")
	}
}

func TestStreamCancelAborts(t *testing.T) {
	cfg := simConfig()
	cfg.ITL = 5 * time.Millisecond
	e, addr := startSim(t, cfg)
	a := newAdapter(t, addr)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := 0
	err := a.Stream(ctx, request(wire.API_API_COMPLETION, `{"prompt":"x","max_tokens":100000}`), func([]byte, bool) error {
		if got++; got == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stream: %v, want context.Canceled", err)
	}
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if n := e.Aborted(); n != 1 {
			return fmt.Errorf("aborted %d, want 1", n)
		}
		return nil
	})
}

func TestHealthAndLoad(t *testing.T) {
	cfg := simConfig()
	cfg.ITL = 5 * time.Millisecond
	cfg.Slots = 1
	_, addr := startSim(t, cfg)
	a := newAdapter(t, addr)
	if err := a.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		once := false
		done <- a.Stream(ctx, request(wire.API_API_COMPLETION, `{"prompt":"x","max_tokens":100000}`), func([]byte, bool) error {
			if !once {
				once = true
				close(started)
			}
			return nil
		})
	}()
	<-started
	l, err := a.Load(t.Context())
	if err != nil || l.Running != 1 || l.KVCacheUsage != 1 {
		t.Fatalf("load %+v %v, want 1 running, usage 1", l, err)
	}
	cancel()
	<-done

	down := newAdapter(t, "127.0.0.1:1")
	hctx, hcancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer hcancel()
	err = down.Health(hctx)
	var we *wire.Error
	if !errors.As(err, &we) || (we.Code != wire.CodeEngineDown && we.Code != wire.CodeEngine) {
		t.Fatalf("health of a dead engine: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	_, addr := startSim(t, simConfig())
	a := newAdapter(t, addr)
	for _, tc := range []struct {
		name string
		api  wire.API
		body string
	}{
		{"engine refuses max tokens", wire.API_API_COMPLETION, `{"prompt":"x","max_tokens":2000000}`},
		{"n", wire.API_API_CHAT, `{"messages":[{"role":"user","content":"x"}],"n":2}`},
		{"no messages", wire.API_API_CHAT, `{"messages":[]}`},
		{"no role", wire.API_API_CHAT, `{"messages":[{"content":"x"}]}`},
		{"image part", wire.API_API_CHAT, `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`},
		{"no prompt", wire.API_API_COMPLETION, `{"max_tokens":3}`},
		{"zero max tokens", wire.API_API_COMPLETION, `{"prompt":"x","max_tokens":0}`},
		{"logprobs", wire.API_API_COMPLETION, `{"prompt":"x","logprobs":2}`},
		{"not json", wire.API_API_CHAT, `{`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := a.Stream(t.Context(), request(tc.api, tc.body), func([]byte, bool) error {
				t.Error("emitted a chunk")
				return nil
			})
			if !errors.Is(err, &wire.Error{Code: wire.CodeBadRequest}) {
				t.Fatalf("got %v, want %s", err, wire.CodeBadRequest)
			}
			var we *wire.Error
			if errors.As(err, &we) && we.HttpStatus != 400 {
				t.Fatalf("http status %d, want 400", we.HttpStatus)
			}
		})
	}
}

func TestVLLMPD(t *testing.T) {
	pcfg := simConfig()
	pcfg.Role, pcfg.PDProtocol = simengine.RolePrefill, simengine.PDVLLM
	_, paddr := startSim(t, pcfg)
	dcfg := simConfig()
	dcfg.Role, dcfg.PDProtocol = simengine.RoleDecode, simengine.PDVLLM
	dec, daddr := startSim(t, dcfg)
	pa, da := newAdapter(t, paddr), newAdapter(t, daddr)

	for _, api := range []wire.API{wire.API_API_CHAT, wire.API_API_COMPLETION} {
		t.Run(api.String(), func(t *testing.T) {
			body := `{"messages":[{"role":"user","content":"Tell me about the sea"}],"max_tokens":20}`
			if api == wire.API_API_COMPLETION {
				body = `{"prompt":"Tell me about the sea","max_tokens":20}`
			}
			req := request(api, body)
			var h *wire.PDHandoff
			if err := pa.Prefill(t.Context(), req, func(x *wire.PDHandoff) error {
				if h != nil {
					t.Error("handoff twice")
				}
				h = x
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if h == nil || h.GetProtocol() != "vllm" {
				t.Fatalf("handoff %v", h)
			}
			var kv simengine.KVTransferParams
			if err := json.Unmarshal(h.GetKvTransferParamsJson(), &kv); err != nil || !kv.DoRemotePrefill || kv.RemotePort == 0 {
				t.Fatalf("kv_transfer_params %s: %v", h.GetKvTransferParamsJson(), err)
			}
			dreq := request(api, body)
			dreq.Job.Pd = h
			c, emit := collect(t, api)
			if err := da.Stream(t.Context(), dreq, emit); err != nil {
				t.Fatal(err)
			}
			c.matches(t, api, body)

			// The hand-off is single use, and another prompt's is refused.
			dreq = request(api, body)
			dreq.Job.Pd = h
			if err := da.Stream(t.Context(), dreq, func([]byte, bool) error { return nil }); !errors.Is(err, &wire.Error{Code: wire.CodeEngine}) {
				t.Fatalf("reused hand-off: %v", err)
			}
		})
	}

	t.Run("forged", func(t *testing.T) {
		before := dec.KVTransferFailures()
		forged := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"sim-nope","remote_block_ids":[1,2],"remote_host":"127.0.0.1","remote_port":1,"tp_size":1}`
		req := request(wire.API_API_COMPLETION, `{"prompt":"x","max_tokens":3}`)
		req.Job.Pd = &wire.PDHandoff{Protocol: "vllm", KvTransferParamsJson: []byte(forged)}
		err := da.Stream(t.Context(), req, func([]byte, bool) error { return nil })
		if !errors.Is(err, &wire.Error{Code: wire.CodeEngine}) || !strings.Contains(err.Error(), "kv_transfer_failed") {
			t.Fatalf("forged hand-off: %v", err)
		}
		if dec.KVTransferFailures() != before+1 {
			t.Fatal("no KV transfer failure counted")
		}
	})

	t.Run("decode without hand-off", func(t *testing.T) {
		err := da.Stream(t.Context(), request(wire.API_API_COMPLETION, `{"prompt":"x"}`), func([]byte, bool) error { return nil })
		if !errors.Is(err, &wire.Error{Code: wire.CodeBadRequest}) {
			t.Fatalf("got %v, want bad request", err)
		}
	})

	t.Run("prefill on a regular engine", func(t *testing.T) {
		_, raddr := startSim(t, simConfig())
		err := newAdapter(t, raddr).Prefill(t.Context(), request(wire.API_API_COMPLETION, `{"prompt":"x"}`),
			func(*wire.PDHandoff) error { t.Error("handoff"); return nil })
		if !errors.Is(err, &wire.Error{Code: wire.CodeEngine}) {
			t.Fatalf("got %v, want engine error", err)
		}
	})
}
