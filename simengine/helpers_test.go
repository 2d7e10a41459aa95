package simengine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func testConfig() Config {
	return Config{Model: "sim-model", TTFT: 0, ITL: 0, Slots: 4}
}

func newTestEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg, WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

func newTestServer(t *testing.T, e *Engine) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(e.Handler()) // binds 127.0.0.1 on a random port
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, ctx context.Context, url string, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

func path(api API) string {
	if api == APIChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// chunk is the union of the chat and completion streaming chunk shapes.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// transcript is a decoded stream.
type transcript struct {
	chunks       []chunk
	raw          [][]byte // chunk JSON as received
	deltas       []string // non-empty content/text deltas
	finish       string
	usage        *usage
	sawRole      bool
	usageIsField bool // every non-usage chunk had "usage":null
}

func (tr *transcript) text() string { return strings.Join(tr.deltas, "") }

func (tr *transcript) add(t *testing.T, api API, raw []byte) {
	t.Helper()
	var c chunk
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("chunk %q: %v", raw, err)
	}
	want := "text_completion"
	if api == APIChat {
		want = "chat.completion.chunk"
	}
	if c.Object != want || c.Model == "" || c.ID == "" || c.Created == 0 {
		t.Fatalf("chunk %s: bad envelope", raw)
	}
	tr.raw = append(tr.raw, bytes.Clone(raw))
	tr.chunks = append(tr.chunks, c)
	if len(c.Choices) == 0 {
		if c.Usage == nil {
			t.Fatalf("chunk %s: no choices and no usage", raw)
		}
		if tr.usage != nil {
			t.Fatalf("second usage chunk %s", raw)
		}
		tr.usage = c.Usage
		return
	}
	if tr.usage != nil {
		t.Fatalf("chunk %s after the usage chunk", raw)
	}
	if tr.finish != "" {
		t.Fatalf("chunk %s after finish_reason", raw)
	}
	ch := c.Choices[0]
	var d *string
	if api == APIChat {
		if ch.Delta == nil {
			t.Fatalf("chat chunk %s without delta", raw)
		}
		if ch.Delta.Role != nil {
			if len(tr.chunks) != 1 || *ch.Delta.Role != "assistant" {
				t.Fatalf("role in chunk %d: %s", len(tr.chunks), raw)
			}
			tr.sawRole = true
		}
		d = ch.Delta.Content
	} else {
		d = ch.Text
	}
	if d != nil && *d != "" {
		tr.deltas = append(tr.deltas, *d)
	}
	if ch.FinishReason != nil {
		tr.finish = *ch.FinishReason
	}
}

// readSSE reads a whole SSE body, checking its framing.
func readSSE(t *testing.T, api API, body io.Reader) *transcript {
	t.Helper()
	all, err := io.ReadAll(body)
	if err != nil {
		t.Fatalf("reading stream: %v", err)
	}
	if !bytes.HasSuffix(all, []byte("data: [DONE]\n\n")) {
		t.Fatalf("stream does not end with [DONE]: %q", all)
	}
	events := strings.Split(strings.TrimSuffix(string(all), "\n\n"), "\n\n")
	tr := &transcript{}
	for i, ev := range events {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("event %d is not one data line: %q", i, ev)
		}
		if i == len(events)-1 {
			if data != "[DONE]" {
				t.Fatalf("last event %q", data)
			}
			break
		}
		tr.add(t, api, []byte(data))
	}
	return tr
}

// stream runs body through Engine.Stream.
func stream(t *testing.T, e *Engine, api API, body string) (*transcript, error) {
	t.Helper()
	tr := &transcript{}
	err := e.Stream(t.Context(), api, []byte(body), func(c []byte) error {
		tr.add(t, api, c)
		return nil
	})
	return tr, err
}

func mustExpect(t *testing.T, api API, body string) Expectation {
	t.Helper()
	x, err := Expect(api, []byte(body))
	if err != nil {
		t.Fatalf("Expect(%s, %s): %v", api, body, err)
	}
	return x
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func chatJSON(extra string, msgs ...string) string {
	var sb strings.Builder
	sb.WriteString(`{"model":"sim-model","messages":[`)
	for i := 0; i+1 < len(msgs); i += 2 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"role":%s,"content":%s}`, jsonString(msgs[i]), jsonString(msgs[i+1]))
	}
	sb.WriteByte(']')
	if extra != "" {
		sb.WriteByte(',')
		sb.WriteString(extra)
	}
	sb.WriteByte('}')
	return sb.String()
}

func completionJSON(prompt, extra string) string {
	b := `{"model":"sim-model","prompt":` + jsonString(prompt)
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

func itoa(n int) string { return fmt.Sprint(n) }
