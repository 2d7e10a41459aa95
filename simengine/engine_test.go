package simengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*Config)
		ok   bool
	}{
		{"default", func(*Config) {}, true},
		{"zero durations", func(c *Config) { c.TTFT, c.ITL = 0, 0 }, true},
		{"no model", func(c *Config) { c.Model = "" }, false},
		{"no slots", func(c *Config) { c.Slots = 0 }, false},
		{"negative itl", func(c *Config) { c.ITL = -1 }, false},
		{"negative prefill", func(c *Config) { c.PrefillPerToken = -1 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mut(&c)
			err := c.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate: %v", err)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("%v does not wrap ErrInvalidConfig", err)
			}
			if _, err := New(c); (err == nil) != tc.ok {
				t.Fatalf("New: %v", err)
			}
		})
	}
}

func TestStreamUsageChunk(t *testing.T) {
	e := newTestEngine(t, testConfig())
	tests := []struct {
		name  string
		extra string
		usage bool
	}{
		{"non-stream body", "", true},
		{"stream", `"stream":true`, false},
		{"stream include_usage", `"stream":true,"stream_options":{"include_usage":true}`, true},
		{"stream include_usage false", `"stream":true,"stream_options":{"include_usage":false}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := completionJSON("hi", `"max_tokens":3`)
			if tc.extra != "" {
				body = withStream(body, tc.extra)
			}
			tr, err := stream(t, e, APICompletion, body)
			if err != nil {
				t.Fatal(err)
			}
			if (tr.usage != nil) != tc.usage {
				t.Fatalf("usage chunk %v, want %v", tr.usage, tc.usage)
			}
			if tr.usage != nil && tr.usage.PromptTokensDetails != nil {
				t.Fatalf("usage %+v: prompt_tokens_details without a prefix cache", tr.usage)
			}
			x := mustExpect(t, APICompletion, body)
			if tr.text() != x.Text || tr.finish != x.FinishReason {
				t.Fatalf("got %q %s, want %q %s", tr.text(), tr.finish, x.Text, x.FinishReason)
			}
		})
	}
}

func TestStreamEmitError(t *testing.T) {
	e := newTestEngine(t, testConfig())
	boom := errors.New("boom")
	err := e.Stream(t.Context(), APIChat, []byte(chatJSON("", "user", "hi")), func([]byte) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	if e.Aborted() != 1 || e.Load().Running != 0 {
		t.Fatalf("aborted %d load %+v", e.Aborted(), e.Load())
	}
}

// With two slots, three of five requests wait, and slots go to waiters in
// arrival order. First chunks block on a channel, so nothing here depends on
// timing.
func TestSlotsQueueFIFO(t *testing.T) {
	cfg := testConfig()
	cfg.Slots = 2
	e := newTestEngine(t, cfg)
	started := make(chan int, 5)
	release := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 5)
	start := func(i int) {
		wg.Go(func() {
			first := true
			errs[i] = e.Stream(t.Context(), APICompletion, []byte(completionJSON("hi", `"max_tokens":2`)), func([]byte) error {
				if first {
					first = false
					started <- i
					<-release
				}
				return nil
			})
		})
	}
	start(0)
	start(1)
	got := map[int]bool{<-started: true, <-started: true}
	if !got[0] || !got[1] {
		t.Fatalf("started %v", got)
	}
	for i := 2; i < 5; i++ {
		start(i)
		testwait.For(t, 5*time.Second, time.Millisecond, func() error {
			if l := e.Load(); l.Running != 2 || l.Waiting != i-1 {
				return fmt.Errorf("load %+v", l)
			}
			return nil
		})
	}
	if l := e.Load(); l.KVUsage != 1 {
		t.Fatalf("kv usage %v", l.KVUsage)
	}
	for want := 2; want < 5; want++ {
		release <- struct{}{}
		if got := <-started; got != want {
			t.Fatalf("slot went to %d, want %d", got, want)
		}
		if l := e.Load(); l.Running > 2 {
			t.Fatalf("load %+v", l)
		}
	}
	release <- struct{}{}
	release <- struct{}{}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if l := e.Load(); l != (Load{}) {
		t.Fatalf("load after %+v", l)
	}
}

// Under real (tiny) timings no more than Slots requests run at once and all
// complete with the expected chunks.
func TestSlotsUnderLoad(t *testing.T) {
	cfg := testConfig()
	cfg.Slots = 2
	cfg.ITL = time.Millisecond
	cfg.TTFT = time.Millisecond
	e := newTestEngine(t, cfg)
	body := completionJSON("Once upon a time,", `"max_tokens":20`)
	x := mustExpect(t, APICompletion, body)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			chunks := 0
			err := e.Stream(context.Background(), APICompletion, []byte(body), func([]byte) error {
				if l := e.Load(); l.Running > 2 || l.Running < 1 {
					t.Errorf("load %+v", l)
				}
				chunks++
				return nil
			})
			if err != nil {
				t.Error(err)
			}
			// tokens, the finish chunk and the usage chunk
			if want := x.CompletionTokens + 2; chunks != want {
				t.Errorf("%d chunks, want %d", chunks, want)
			}
		})
	}
	wg.Wait()
	if l := e.Load(); l != (Load{}) {
		t.Fatalf("load after %+v", l)
	}
}

func TestCancelMidStream(t *testing.T) {
	cfg := testConfig()
	cfg.Slots = 1
	e := newTestEngine(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n := 0
	err := e.Stream(ctx, APIChat, []byte(chatJSON(`"max_tokens":100`, "user", "hi")), func([]byte) error {
		n++
		if n == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if n != 3 || e.Aborted() != 1 || e.Load().Running != 0 {
		t.Fatalf("chunks %d aborted %d load %+v", n, e.Aborted(), e.Load())
	}
	// The slot is free again.
	if _, err := stream(t, e, APIChat, chatJSON(`"max_tokens":2`, "user", "hi")); err != nil {
		t.Fatal(err)
	}
}

// An HTTP client that goes away mid-stream, while a second request waits,
// frees the slot and the queue entry; the ITL is so long that only the
// disconnect can end the first request.
func TestHTTPClientDisconnect(t *testing.T) {
	cfg := testConfig()
	cfg.Slots = 1
	cfg.ITL = time.Hour
	e := newTestEngine(t, cfg)
	srv := newTestServer(t, e)

	ctx1, cancel1 := context.WithCancel(t.Context())
	defer cancel1()
	resp := post(t, ctx1, srv.URL+"/v1/completions", completionJSON("hi", `"max_tokens":10,"stream":true`))
	defer resp.Body.Close()
	buf := make([]byte, 1)
	if _, err := io.ReadFull(resp.Body, buf); err != nil { // the first token has been sent
		t.Fatal(err)
	}

	ctx2, cancel2 := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, srv.URL+"/v1/completions",
			strings.NewReader(completionJSON("hi", `"max_tokens":10,"stream":true`)))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if l := e.Load(); l.Running != 1 || l.Waiting != 1 {
			return fmt.Errorf("load %+v", l)
		}
		return nil
	})
	cancel2()
	<-done
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if l := e.Load(); l.Waiting != 0 || e.Aborted() != 1 {
			return fmt.Errorf("load %+v aborted %d", l, e.Aborted())
		}
		return nil
	})
	cancel1()
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if l := e.Load(); l.Running != 0 || e.Aborted() != 2 {
			return fmt.Errorf("load %+v aborted %d", l, e.Aborted())
		}
		return nil
	})
}
