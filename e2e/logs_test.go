package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestRequestLogLine: one JSON line per finished request at info, with the
// documented fields and nothing of the prompt or the output.
func TestRequestLogLine(t *testing.T) {
	b := cmdtest.StartBroker(t, "--log-format", "json", "--log-level", "info")
	startAgent(t, b.NATS, "a1", fastEngine(t, 4), 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	const secret = "zebra-unicorn-secret-prompt"
	req := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"max_tokens":4}`, secret)
	status, body := post(t, b.HTTP+"/v1/chat/completions", req)
	if status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	var output struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	_ = json.Unmarshal([]byte(body), &output)
	var line map[string]any
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		for _, l := range strings.Split(b.Err.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
				line = m
				return nil
			}
		}
		return fmt.Errorf("no request line yet")
	})
	for _, k := range []string{"request_id", "client_request_id", "model", "route", "agents", "attempts", "ttft", "duration", "tokens", "outcome"} {
		if _, ok := line[k]; !ok {
			t.Errorf("request line lacks %s: %v", k, line)
		}
	}
	if line["level"] != "INFO" || line["outcome"] != "ok" || line["agents"] != "a1" || line["tokens"] != 4.0 {
		t.Fatalf("request line %v", line)
	}
	logs := b.Err.String()
	if strings.Contains(logs, secret) {
		t.Fatal("the prompt reached the logs")
	}
	if out := strings.TrimSpace(output.Choices[0].Message.Content); out != "" && strings.Contains(logs, out) {
		t.Fatal("the output reached the logs")
	}
}
