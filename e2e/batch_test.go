package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// batchInput is a batch input file of n chat lines for model, custom_ids
// req-0 to req-<n-1>.
func batchInput(model string, n int) []byte {
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[{"role":"user","content":"line %d"}],"max_tokens":4}}`+"\n", i, model, i)
	}
	return b.Bytes()
}

// batchLine is one line of an output or error file.
type batchLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// uploadBatch uploads data as a batch input file through the SDK.
func uploadBatch(t testing.TB, c openai.Client, data []byte) *openai.FileObject {
	t.Helper()
	f, err := c.Files.New(context.Background(), openai.FileNewParams{
		File:    openai.File(bytes.NewReader(data), "input.jsonl", "application/jsonl"),
		Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// waitBatch polls the batch until its status is one of want.
func waitBatch(t testing.TB, c openai.Client, id string, within time.Duration, want ...openai.BatchStatus) *openai.Batch {
	t.Helper()
	var b *openai.Batch
	testwait.For(t, within, 50*time.Millisecond, func() error {
		var err error
		if b, err = c.Batches.Get(context.Background(), id); err != nil {
			return err
		}
		for _, w := range want {
			if b.Status == w {
				return nil
			}
		}
		return fmt.Errorf("batch %s is %s (counts %+v), want %v", id, b.Status, b.RequestCounts, want)
	})
	return b
}

// readLines downloads a batch's output or error file through the SDK;
// "" gives none.
func readLines(t testing.TB, c openai.Client, fileID string) []batchLine {
	t.Helper()
	if fileID == "" {
		return nil
	}
	resp, err := c.Files.Content(context.Background(), fileID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []batchLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		var l batchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// exactlyOnce checks that the lines hold each custom_id req-0..req-<n-1>
// exactly once, and returns them by custom_id.
func exactlyOnce(t testing.TB, n int, files ...[]batchLine) map[string]batchLine {
	t.Helper()
	seen := map[string]batchLine{}
	for _, f := range files {
		for _, l := range f {
			if _, dup := seen[l.CustomID]; dup {
				t.Fatalf("custom_id %s twice", l.CustomID)
			}
			seen[l.CustomID] = l
		}
	}
	for i := 0; i < n; i++ {
		if _, ok := seen[fmt.Sprintf("req-%d", i)]; !ok {
			t.Fatalf("custom_id req-%d missing (%d lines)", i, len(seen))
		}
	}
	if len(seen) != n {
		t.Fatalf("%d custom_ids, want %d", len(seen), n)
	}
	return seen
}

// TestBatchSDK runs a batch end to end through the official SDK: the file
// uploaded, listed, read back; the batch created, listed, run by the
// fleet, and its output read with every custom_id answered once.
func TestBatchSDK(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: "m", TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	c := sdk(b.HTTP)
	ctx := context.Background()
	const n = 40
	input := batchInput("m", n)

	f := uploadBatch(t, c, input)
	if f.Purpose != "batch" || f.Bytes != int64(len(input)) || f.Filename != "input.jsonl" || !strings.HasPrefix(f.ID, "file-") {
		t.Fatalf("file %+v", f)
	}
	got, err := c.Files.Get(ctx, f.ID)
	if err != nil || got.ID != f.ID || got.Bytes != f.Bytes {
		t.Fatalf("files.retrieve: %+v %v", got, err)
	}
	list, err := c.Files.List(ctx, openai.FileListParams{Purpose: openai.String("batch")})
	if err != nil || len(list.Data) != 1 || list.Data[0].ID != f.ID {
		t.Fatalf("files.list: %+v %v", list, err)
	}
	resp, err := c.Files.Content(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	back, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(back, input) {
		t.Fatalf("files.content: %d bytes differ from the %d uploaded", len(back), len(input))
	}

	bt, err := c.Batches.New(ctx, openai.BatchNewParams{
		InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h,
		Metadata:         map[string]string{"job": "eval"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if bt.Status != openai.BatchStatusValidating || bt.Metadata["job"] != "eval" || bt.ExpiresAt-bt.CreatedAt != 24*3600 {
		t.Fatalf("batch %+v", bt)
	}
	done := waitBatch(t, c, bt.ID, 60*time.Second, openai.BatchStatusCompleted)
	if done.RequestCounts.Total != n || done.RequestCounts.Completed != n || done.RequestCounts.Failed != 0 ||
		done.OutputFileID == "" || done.ErrorFileID != "" || done.CompletedAt == 0 || done.InProgressAt == 0 || done.FinalizingAt == 0 {
		t.Fatalf("completed batch %+v", done)
	}
	lines := exactlyOnce(t, n, readLines(t, c, done.OutputFileID))
	for id, l := range lines {
		if l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil || !strings.HasPrefix(l.ID, "batch_req_") || l.Response.RequestID == "" {
			t.Fatalf("%s: line %+v", id, l)
		}
		var cc openai.ChatCompletion
		if err := json.Unmarshal(l.Response.Body, &cc); err != nil || len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" || cc.Usage.CompletionTokens == 0 {
			t.Fatalf("%s: body %s: %v", id, l.Response.Body, err)
		}
	}
	bl, err := c.Batches.List(ctx, openai.BatchListParams{})
	if err != nil || len(bl.Data) != 1 || bl.Data[0].ID != bt.ID {
		t.Fatalf("batches.list: %+v %v", bl, err)
	}
	// The output file is a file of its own: listed, and deletable.
	out, err := c.Files.Get(ctx, done.OutputFileID)
	if err != nil || out.Purpose != "batch_output" {
		t.Fatalf("output file %+v %v", out, err)
	}
	if _, err := c.Files.Delete(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Files.Get(ctx, f.ID); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("deleted file: %v", err)
	}
	// The lines ran as this broker counts them.
	if m := batchMetrics(t, b.HTTP); !strings.Contains(m, `switchyard_batch_lines_total{model="m",outcome="completed"} 40`) {
		t.Fatalf("metrics:\n%s", grepLines(m, "switchyard_batch"))
	}
}

func isStatus(err error, status int) bool {
	var ae *openai.Error
	return errors.As(err, &ae) && ae.StatusCode == status
}

func batchMetrics(t testing.TB, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var _ = option.WithAPIKey
