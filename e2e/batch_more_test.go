package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/simengine"
)

// TestBatchValidation fails batches whose input OpenAI would refuse, with
// the error code and line of the first refusal, and refuses bad create
// parameters at once.
func TestBatchValidation(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: "m", TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	c := sdk(b.HTTP)
	ctx := context.Background()
	good := func(id string) string {
		return `{"custom_id":"` + id + `","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"x"}]}}`
	}
	for _, tc := range []struct {
		name  string
		input string
		code  string
		line  int64
	}{
		{"malformed", good("a") + "\n{not json\n", "invalid_json_line", 2},
		{"missing custom_id", `{"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}` + "\n", "missing_required_parameter", 1},
		{"duplicate custom_id", good("a") + "\n" + good("b") + "\n" + good("a") + "\n", "duplicate_custom_id", 3},
		{"other url", good("a") + "\n" + strings.Replace(good("b"), "/v1/chat/completions", "/v1/embeddings", 1) + "\n", "invalid_url", 2},
		{"method", strings.Replace(good("a"), `"POST"`, `"GET"`, 1) + "\n", "invalid_value", 1},
		{"unknown model", strings.Replace(good("a"), `"model":"m"`, `"model":"nope"`, 1) + "\n", "model_not_found", 1},
		{"empty", "\n\n", "empty_file", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := uploadBatch(t, c, []byte(tc.input))
			bt, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
			if err != nil {
				t.Fatal(err)
			}
			got := waitBatch(t, c, bt.ID, 30*time.Second, openai.BatchStatusFailed)
			if got.FailedAt == 0 || len(got.Errors.Data) == 0 || got.Errors.Data[0].Code != tc.code || got.Errors.Data[0].Line != tc.line || got.OutputFileID != "" {
				t.Fatalf("failed batch: %+v errors %+v", got, got.Errors.Data)
			}
		})
	}
	f := uploadBatch(t, c, []byte(good("a")+"\n"))
	for _, tc := range []struct {
		name  string
		p     openai.BatchNewParams
		param string
	}{
		{"endpoint", openai.BatchNewParams{InputFileID: f.ID, Endpoint: "/v1/responses", CompletionWindow: "24h"}, "endpoint"},
		{"window", openai.BatchNewParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "1h"}, "completion_window"},
		{"no file", openai.BatchNewParams{InputFileID: "file-nope", Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, "input_file_id"},
	} {
		t.Run("create "+tc.name, func(t *testing.T) {
			_, err := c.Batches.New(ctx, tc.p)
			var ae *openai.Error
			if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Param != tc.param {
				t.Fatalf("want a 400 naming %s, got %v", tc.param, err)
			}
		})
	}
	// A purpose other than batch is refused, and nothing of it is kept.
	_, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader("x"), "a.jsonl", "application/jsonl"), Purpose: openai.FilePurposeFineTune})
	if !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("purpose fine-tune: %v", err)
	}
	if l, err := c.Files.List(ctx, openai.FileListParams{}); err != nil || len(l.Data) != 8 {
		t.Fatalf("files after the refused upload: %d, %v", len(l.Data), err)
	}
}

// TestBatchFileLimit refuses an upload over --max-file-bytes with 413 and
// keeps nothing of it.
func TestBatchFileLimit(t *testing.T) {
	b := cmdtest.StartBroker(t, "--max-file-bytes", "1000")
	c := sdk(b.HTTP)
	_, err := c.Files.New(context.Background(), openai.FileNewParams{File: openai.File(strings.NewReader(strings.Repeat("x", 1001)), "a.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if !isStatus(err, http.StatusRequestEntityTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
	if l, err := c.Files.List(context.Background(), openai.FileListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("files after the refused upload: %+v, %v", l, err)
	}
}

// TestBatchKeys keeps each API key's files and batches its own.
func TestBatchKeys(t *testing.T) {
	b := cmdtest.StartBroker(t, "--api-key", "key-one", "--api-key", "key-two")
	e := startEngine(t, simengine.Config{Model: "m", TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4})
	startAgent(t, b.NATS, "a1", e, 4)
	one := openai.NewClient(option.WithBaseURL(b.HTTP+"/v1/"), option.WithAPIKey("key-one"), option.WithMaxRetries(0))
	two := openai.NewClient(option.WithBaseURL(b.HTTP+"/v1/"), option.WithAPIKey("key-two"), option.WithMaxRetries(0))
	ctx := context.Background()
	f := uploadBatch(t, one, batchInput("m", 3))
	bt, err := one.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := two.Files.Get(ctx, f.ID); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("other key's file: %v", err)
	}
	if _, err := two.Files.Content(ctx, f.ID); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("other key's file content: %v", err)
	}
	if l, err := two.Files.List(ctx, openai.FileListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("other key's file list: %+v %v", l.Data, err)
	}
	if _, err := two.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}); !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("batch of another key's file: %v", err)
	}
	if _, err := two.Batches.Get(ctx, bt.ID); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("other key's batch: %v", err)
	}
	if _, err := two.Batches.Cancel(ctx, bt.ID); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("cancel of another key's batch: %v", err)
	}
	if l, err := two.Batches.List(ctx, openai.BatchListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("other key's batch list: %+v %v", l.Data, err)
	}
	done := waitBatch(t, one, bt.ID, 60*time.Second, openai.BatchStatusCompleted)
	exactlyOnce(t, 3, readLines(t, one, done.OutputFileID))
	if _, err := two.Files.Content(ctx, done.OutputFileID); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("other key's output: %v", err)
	}
}

// slowBatch starts a broker with args and one agent on an engine slow
// enough that a batch of n lines is still running when the test acts, and
// creates the batch.
func slowBatch(t *testing.T, n int, args ...string) (openai.Client, *cmdtest.Broker, string) {
	t.Helper()
	b := cmdtest.StartBroker(t, args...)
	e := startEngine(t, simengine.Config{Model: "m", TTFT: 300 * time.Millisecond, ITL: time.Millisecond, Slots: 2})
	startAgent(t, b.NATS, "a1", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	c := sdk(b.HTTP)
	f := uploadBatch(t, c, batchInput("m", n))
	bt, err := c.Batches.New(context.Background(), openai.BatchNewParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	return c, b, bt.ID
}

// checkCutOff checks a batch cut off by a cancel or its window: every
// custom_id once in its files, the lines it ran answered, the others
// carrying code, and the counts adding up.
func checkCutOff(t *testing.T, c openai.Client, bt *openai.Batch, n int, code string) {
	t.Helper()
	out, errs := readLines(t, c, bt.OutputFileID), readLines(t, c, bt.ErrorFileID)
	exactlyOnce(t, n, out, errs)
	cut := 0
	for _, l := range errs {
		if l.Error == nil || l.Error.Code != code || l.Response != nil {
			t.Fatalf("error line %+v, want code %s", l, code)
		}
		cut++
	}
	for _, l := range out {
		if l.Response == nil || l.Response.StatusCode != 200 {
			t.Fatalf("output line %+v", l)
		}
	}
	if cut == 0 || len(out) == 0 {
		t.Fatalf("%d lines answered, %d cut off: want some of each", len(out), cut)
	}
	rc := bt.RequestCounts
	if rc.Total != int64(n) || rc.Completed != int64(len(out)) || rc.Failed != int64(cut) {
		t.Fatalf("counts %+v, files %d and %d lines", rc, len(out), cut)
	}
}

// TestBatchCancel cancels a running batch: cancelling, then cancelled with
// the lines already answered kept and the others in the error file.
func TestBatchCancel(t *testing.T) {
	const n = 60
	c, b, id := slowBatch(t, n, "--batch-inflight", "2")
	ctx := context.Background()
	waitFor(t, c, id, func(bt *openai.Batch) bool { return bt.RequestCounts.Completed >= 2 })
	// The fleet view shows the batch in flight with its lines.
	fl := getFleetBatches(t, b.HTTP)
	if fl.Active != 1 || len(fl.Items) != 1 || fl.Items[0].ID != id || fl.Items[0].Lines.Total != n || fl.Items[0].Driver == "" {
		t.Fatalf("fleet batches %+v", fl)
	}
	// Its input cannot be deleted while it runs.
	cur, err := c.Batches.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Files.Delete(ctx, cur.InputFileID); !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("deleting a running batch's input: %v", err)
	}
	got, err := c.Batches.Cancel(ctx, id)
	if err != nil || (got.Status != openai.BatchStatusCancelling && got.Status != openai.BatchStatusCancelled) || got.CancellingAt == 0 {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	done := waitBatch(t, c, id, 60*time.Second, openai.BatchStatusCancelled)
	if done.CancelledAt == 0 {
		t.Fatalf("cancelled batch %+v", done)
	}
	checkCutOff(t, c, done, n, "batch_cancelled")
	if _, err := c.Files.Delete(ctx, cur.InputFileID); err != nil {
		t.Fatalf("deleting an ended batch's input: %v", err)
	}
	if fl := getFleetBatches(t, b.HTTP); fl.Active != 0 {
		t.Fatalf("fleet batches after the end %+v", fl)
	}
}

// TestBatchExpiry ends a batch at its window (shortened by
// --batch-window-cap) with its partial results, the lines not run as
// batch_expired errors.
func TestBatchExpiry(t *testing.T) {
	const n = 60
	c, _, id := slowBatch(t, n, "--batch-inflight", "2", "--batch-window-cap", "3s")
	done := waitBatch(t, c, id, 60*time.Second, openai.BatchStatusExpired)
	if done.ExpiredAt == 0 || done.ExpiresAt-done.CreatedAt != 3 {
		t.Fatalf("expired batch %+v", done)
	}
	checkCutOff(t, c, done, n, "batch_expired")
}

func waitFor(t *testing.T, c openai.Client, id string, ok func(*openai.Batch) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		bt, err := c.Batches.Get(context.Background(), id)
		if err == nil && ok(bt) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s: %+v %v", id, bt, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type fleetBatches struct {
	Active int `json:"active"`
	Lines  struct {
		Total, Queued, Running, Completed, Failed int
	} `json:"lines"`
	Items []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Driver string `json:"driver"`
		Lines  struct {
			Total     int `json:"total"`
			Completed int `json:"completed"`
		} `json:"lines"`
	} `json:"items"`
}

func getFleetBatches(t testing.TB, base string) fleetBatches {
	t.Helper()
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Batches *fleetBatches `json:"batches"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Batches == nil {
		t.Fatalf("fleet: %v %+v", err, v)
	}
	return *v.Batches
}

var _ = fmt.Sprint
