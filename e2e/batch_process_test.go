//go:build unix

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestBatchBrokerKill SIGKILLs the broker driving a batch mid-way: the
// other broker takes the batch over once the lease lapses, runs only what
// was not recorded, and the output holds every custom_id exactly once.
func TestBatchBrokerKill(t *testing.T) {
	bin := buildBinary(t, "github.com/switchyard-ai/switchyard/cmd/broker", "broker", false)
	ns := startNATSProcess(t, t.TempDir())
	start := func(id string) (*child, string) {
		p := startChild(t, bin, "--nats-url", ns.URL(), "--http", "127.0.0.1:0", "--grpc", "", "--id", id,
			"--heartbeat-interval", "100ms", "--slow-start", "0", "--log-level", "info", "--batch-lease", "2s", "--batch-inflight", "4")
		base, _, _ := cmdtest.WaitBroker(t, p.out, p.exited)
		return p, base
	}
	pa, baseA := start("broker-a")
	pb, baseB := start("broker-b")
	startAgentCmd(t, ns.URL(), "--nats-url", ns.URL(), "--engine", "sim", "--id", "a1", "--model", "m", "--slots", "4",
		"--heartbeat", "500ms", "--sim-ttft", "50ms", "--sim-itl", "1ms", "--log-level", "warn", "--slow-start", "0")
	cmdtest.WaitEligible(t, baseA, "a1")
	cmdtest.WaitEligible(t, baseB, "a1")
	const n = 300
	ca := sdk(baseA)
	f := uploadBatch(t, ca, batchInput("m", n))
	bt, err := ca.Batches.New(context.Background(), openai.BatchNewParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	// Kill the driver once part of the batch is recorded.
	var driver string
	testwait.For(t, 60*time.Second, 20*time.Millisecond, func() error {
		fl := getFleetBatches(t, baseA)
		if len(fl.Items) != 1 || fl.Items[0].Driver == "" || fl.Items[0].Lines.Completed < 20 {
			return fmt.Errorf("fleet batches %+v", fl)
		}
		driver = fl.Items[0].Driver
		return nil
	})
	victim, survivor := pa, baseB
	if driver == "broker-b" {
		victim, survivor = pb, baseA
	}
	victim.signal(t, syscall.SIGKILL)
	cs := sdk(survivor)
	done := waitBatch(t, cs, bt.ID, 120*time.Second, openai.BatchStatusCompleted)
	lines := exactlyOnce(t, n, readLines(t, cs, done.OutputFileID))
	for id, l := range lines {
		if l.Response == nil || l.Response.StatusCode != 200 {
			t.Fatalf("%s: %+v", id, l)
		}
	}
	if done.RequestCounts.Completed != n || done.ErrorFileID != "" {
		t.Fatalf("batch %+v", done)
	}
}

// TestBatchLargeFile moves a large file (256 MiB; SWITCHYARD_BATCH_FILE_MB
// sets another size) through a broker process, up and back down, and
// checks its bytes and that the broker's peak RSS (its embedded NATS
// server's included) grew by less than half the file: it is streamed to
// and from the Object Store, never held.
func TestBatchLargeFile(t *testing.T) {
	if testing.Short() {
		t.Skip("a 256 MiB file")
	}
	mb := 256
	if v := os.Getenv("SWITCHYARD_BATCH_FILE_MB"); v != "" {
		mb, _ = strconv.Atoi(v)
	}
	size := int64(mb) << 20
	bin := buildBinary(t, "github.com/switchyard-ai/switchyard/cmd/broker", "broker", false)
	bp := startChild(t, bin, "--http", "127.0.0.1:0", "--grpc", "", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-level", "warn", "--max-file-bytes", strconv.FormatInt(size+1<<20, 10))
	base, _, _ := cmdtest.WaitBroker(t, bp.out, bp.exited)
	peak0 := peakRSS(t, bp.cmd.Process.Pid)

	// The body is made as it is sent: a line of JSON repeated.
	line := []byte(`{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 400) + `"}]}}` + "\n")
	gen := func() io.Reader {
		return io.LimitReader(&repeat{b: line}, size)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		_ = mw.WriteField("purpose", "batch")
		fw, _ := mw.CreateFormFile("file", "big.jsonl")
		_, err := io.Copy(fw, gen())
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	began := time.Now()
	resp, err := http.Post(base+"/v1/files", mw.FormDataContentType(), pr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	up := time.Since(began)
	var f openai.FileObject
	if err := f.UnmarshalJSON(body); err != nil || f.Bytes != size {
		t.Fatalf("file %s: %v", body, err)
	}
	peakUp := peakRSS(t, bp.cmd.Process.Pid)

	began = time.Now()
	resp, err = http.Get(base + "/v1/files/" + f.ID + "/content")
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	resp.Body.Close()
	if err != nil || n != size {
		t.Fatalf("download: %d bytes, %v", n, err)
	}
	down := time.Since(began)
	want := sha256.New()
	_, _ = io.Copy(want, gen())
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("downloaded bytes differ from the uploaded ones")
	}
	peakDown := peakRSS(t, bp.cmd.Process.Pid)
	const mib = 1 << 20
	t.Logf("%d MiB file: upload %s, download %s; broker peak RSS %.0f MiB at rest, %.0f after the upload, %.0f after the download",
		mb, up.Round(time.Millisecond), down.Round(time.Millisecond), float64(peak0)/mib, float64(peakUp)/mib, float64(peakDown)/mib)
	if grew := peakDown - peak0; grew > size/2 {
		t.Fatalf("broker peak RSS grew by %d MiB moving a %d MiB file", grew/mib, mb)
	}
}

// repeat reads b over and over.
type repeat struct {
	b   []byte
	off int
}

func (r *repeat) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.b[r.off:])
		n += c
		r.off = (r.off + c) % len(r.b)
	}
	return n, nil
}

// peakRSS is a process's peak resident set (VmHWM), in bytes.
func peakRSS(t testing.TB, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
