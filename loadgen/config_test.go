package loadgen

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseDist(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Dist
		ok       bool
	}{
		{"plain", "128", Dist{128, 128}, true},
		{"fixed", "fixed:7", Dist{7, 7}, true},
		{"uniform", "uniform:10-20", Dist{10, 20}, true},
		{"uniform of one", "uniform:5-5", Dist{5, 5}, true},
		{"zero", "0", Dist{}, false},
		{"reversed", "uniform:20-10", Dist{}, false},
		{"no range", "uniform:10", Dist{}, false},
		{"unknown kind", "normal:5", Dist{}, false},
		{"not a number", "fixed:x", Dist{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDist(tc.in)
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
			if !tc.ok {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("err %v does not wrap ErrInvalidConfig", err)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if back, err := ParseDist(got.String()); err != nil || back != got {
				t.Fatalf("String %q does not round-trip: %+v, %v", got.String(), back, err)
			}
		})
	}
}

func TestParseSLO(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     SLO
		ok       bool
	}{
		{"empty", "", SLO{}, true},
		{"ms units", "ttft=200ms,tpot=50ms", SLO{TTFT: 200 * time.Millisecond, TPOT: 50 * time.Millisecond}, true},
		{"seconds", "e2e=2s", SLO{E2E: 2 * time.Second}, true},
		{"vLLM plain ms", "ttft=200,e2el=1500", SLO{TTFT: 200 * time.Millisecond, E2E: 1500 * time.Millisecond}, true},
		{"spaces", "ttft=1s, tpot=0.5s", SLO{TTFT: time.Second, TPOT: 500 * time.Millisecond}, true},
		{"unknown key", "itl=5ms", SLO{}, false},
		{"no value", "ttft", SLO{}, false},
		{"bad value", "ttft=fast", SLO{}, false},
		{"zero", "ttft=0", SLO{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSLO(tc.in)
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func validConfig() Config {
	return Config{URL: "http://127.0.0.1:1", Model: "m", Concurrency: 1, Requests: 1, PromptTokens: Fixed(4), MaxTokens: Fixed(4)}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error; "" for valid
	}{
		{"valid", func(*Config) {}, ""},
		{"poisson without cap", func(c *Config) { c.Concurrency, c.Rate = 0, 5 }, ""},
		{"prompts file without max tokens", func(c *Config) {
			c.MaxTokens, c.PromptTokens = Dist{}, Dist{}
			c.Prompts = []Prompt{{Prompt: "hi", MaxTokens: 3}}
		}, ""},
		{"no url", func(c *Config) { c.URL = "" }, "url"},
		{"relative url", func(c *Config) { c.URL = "127.0.0.1:8080" }, "url"},
		{"bad api", func(c *Config) { c.API = "embeddings" }, "api"},
		{"no model", func(c *Config) { c.Model = "" }, "model"},
		{"no load", func(c *Config) { c.Concurrency = 0 }, "concurrency or rate"},
		{"infinite rate for a duration", func(c *Config) {
			c.Rate, c.Requests, c.Duration = math.Inf(1), 0, time.Second
		}, "infinite"},
		{"no stop", func(c *Config) { c.Requests = 0 }, "request count or a duration"},
		{"no prompt length", func(c *Config) { c.PromptTokens = Dist{} }, "prompt tokens"},
		{"no max tokens", func(c *Config) { c.MaxTokens = Dist{} }, "max tokens"},
		{"messages on completions", func(c *Config) {
			c.API = APICompletion
			c.Prompts = []Prompt{{Messages: json.RawMessage(`[]`)}}
		}, "chat API"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mutate(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestReadPrompts(t *testing.T) {
	in := `{"prompt":"hello there","max_tokens":5}

{"messages":[{"role":"user","content":"hi"}]}
`
	ps, err := ReadPrompts(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Prompt != "hello there" || ps[0].MaxTokens != 5 || string(ps[1].Messages) != `[{"role":"user","content":"hi"}]` {
		t.Fatalf("got %+v", ps)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"bad json", "{\"prompt\":\"a\"}\n{oops\n", "line 2"},
		{"neither field", `{"max_tokens":3}`, "line 1"},
		{"empty", "\n\n", "no prompts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadPrompts(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestSyntheticSpec(t *testing.T) {
	c := validConfig()
	c.Seed = 42
	c.PromptTokens = Dist{10, 20}
	c.MaxTokens = Dist{3, 5}
	seenP, seenM := map[int]bool{}, map[int]bool{}
	for i := range 500 {
		s := c.spec(i)
		words := len(strings.Fields(s.prompt.Prompt))
		if words != s.promptTokens || words < 10 || words > 20 {
			t.Fatalf("request %d: %d words, promptTokens %d, want 10..20", i, words, s.promptTokens)
		}
		if s.maxTokens < 3 || s.maxTokens > 5 {
			t.Fatalf("request %d: max tokens %d, want 3..5", i, s.maxTokens)
		}
		seenP[words], seenM[s.maxTokens] = true, true
		if again := c.spec(i); again.prompt.Prompt != s.prompt.Prompt || again.maxTokens != s.maxTokens {
			t.Fatalf("request %d is not a pure function of seed and index", i)
		}
	}
	if len(seenP) != 11 || len(seenM) != 3 {
		t.Fatalf("uniform draws cover %d prompt lengths and %d max tokens, want 11 and 3", len(seenP), len(seenM))
	}
	if c.spec(0).prompt.Prompt == c.spec(1).prompt.Prompt {
		t.Fatal("two requests share a prompt; prefix caching would flatter the server")
	}
}

func TestBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  API
		p    Prompt
		want map[string]any
	}{
		{"chat synthetic", APIChat, Prompt{Prompt: "a \"b\""}, map[string]any{
			"messages": []any{map[string]any{"role": "user", "content": "a \"b\""}},
		}},
		{"chat messages", APIChat, Prompt{Messages: json.RawMessage(`[{"role":"system","content":"s"}]`)}, map[string]any{
			"messages": []any{map[string]any{"role": "system", "content": "s"}},
		}},
		{"completion", APICompletion, Prompt{Prompt: "x y"}, map[string]any{"prompt": "x y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			c.API = tc.api
			var got map[string]any
			if err := json.Unmarshal(c.body(spec{prompt: tc.p, maxTokens: 9}), &got); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{"model": "m", "max_tokens": 9.0, "stream": true,
				"stream_options": map[string]any{"include_usage": true}}
			for k, v := range tc.want {
				want[k] = v
			}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			if string(gj) != string(wj) {
				t.Fatalf("body\n got %s\nwant %s", gj, wj)
			}
		})
	}
}
