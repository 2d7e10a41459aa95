package simengine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

func pdConfig(role Role, proto PDProtocol) Config {
	c := testConfig()
	c.Role, c.PDProtocol = role, proto
	c.BootstrapHost = "127.0.0.1"
	c.BootstrapPort = 0
	c.BootstrapTimeout = 10 * time.Second
	c.TTFT, c.PrefillPerToken, c.ITL = time.Millisecond, 10*time.Microsecond, 100*time.Microsecond
	return c
}

// pdEngine starts an engine and its HTTP server, closing both at cleanup.
func pdEngine(t *testing.T, cfg Config) (*Engine, *httptest.Server) {
	t.Helper()
	e := newTestEngine(t, cfg)
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e, newTestServer(t, e)
}

// result is a finished HTTP exchange, streaming or not.
type result struct {
	status int
	raw    []byte
	text   string
	usage  *usage
	finish string
	kv     json.RawMessage // top-level kv_transfer_params
	err    *errorDetail    // error body or error event
}

// exchange is a raw HTTP exchange; fetch is safe to call from any goroutine.
type exchange struct {
	status int
	sse    bool
	raw    []byte
	err    error
}

func fetch(ctx context.Context, url string, api API, body string) exchange {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path(api), strings.NewReader(body))
	if err != nil {
		return exchange{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return exchange{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return exchange{
		status: resp.StatusCode,
		sse:    strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"),
		raw:    raw,
		err:    err,
	}
}

// goFetch runs fetch in a goroutine.
func goFetch(ctx context.Context, url string, api API, body string) <-chan exchange {
	ch := make(chan exchange, 1)
	go func() { ch <- fetch(ctx, url, api, body) }()
	return ch
}

func do(t *testing.T, ctx context.Context, url string, api API, body string) result {
	t.Helper()
	return parse(t, api, fetch(ctx, url, api, body))
}

func parse(t *testing.T, api API, x exchange) result {
	t.Helper()
	if x.err != nil {
		t.Fatalf("request: %v", x.err)
	}
	raw := x.raw
	res := result{status: x.status, raw: raw}
	if x.status != http.StatusOK {
		var eb struct {
			Error errorDetail `json:"error"`
		}
		if err := json.Unmarshal(raw, &eb); err != nil || eb.Error.Message == "" {
			t.Fatalf("error body %q: %v", raw, err)
		}
		res.err = &eb.Error
		return res
	}
	if x.sse {
		if ev, ok := bytes.CutPrefix(raw, []byte(`data: {"error":`)); ok {
			if !bytes.HasSuffix(ev, []byte("}\n\ndata: [DONE]\n\n")) {
				t.Fatalf("error event stream %q", raw)
			}
			var eb struct {
				Error errorDetail `json:"error"`
			}
			data := strings.TrimSuffix(strings.TrimPrefix(string(raw), "data: "), "\n\ndata: [DONE]\n\n")
			if err := json.Unmarshal([]byte(data), &eb); err != nil {
				t.Fatalf("error event %q: %v", data, err)
			}
			res.err = &eb.Error
			return res
		}
		tr := readSSE(t, api, bytes.NewReader(raw))
		res.text, res.usage, res.finish = tr.text(), tr.usage, tr.finish
		return res
	}
	var b struct {
		Choices []struct {
			Text    *string `json:"text"`
			Message *struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage            *usage          `json:"usage"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(raw, &b); err != nil || len(b.Choices) != 1 {
		t.Fatalf("response %s: %v", raw, err)
	}
	c := b.Choices[0]
	if c.Message != nil {
		res.text = c.Message.Content
	} else if c.Text != nil {
		res.text = *c.Text
	}
	res.usage, res.finish, res.kv = b.Usage, c.FinishReason, b.KVTransferParams
	return res
}

// matches checks res against what a regular engine gives for body.
func (res result) matches(t *testing.T, api API, body string) {
	t.Helper()
	if res.status != http.StatusOK || res.err != nil {
		t.Fatalf("status %d: %s", res.status, res.raw)
	}
	x := mustExpect(t, api, body)
	if res.text != x.Text || res.finish != x.FinishReason {
		t.Fatalf("got %q (%s), want %q (%s)", res.text, res.finish, x.Text, x.FinishReason)
	}
	if res.usage == nil || res.usage.PromptTokens != x.PromptTokens ||
		res.usage.CompletionTokens != x.CompletionTokens || res.usage.TotalTokens != x.PromptTokens+x.CompletionTokens {
		t.Fatalf("usage %+v, want %d+%d", res.usage, x.PromptTokens, x.CompletionTokens)
	}
}

func (res result) kvFailed(t *testing.T) {
	t.Helper()
	if res.err == nil {
		t.Fatalf("no error: %d %s", res.status, res.raw)
	}
	if res.err.Code == nil || *res.err.Code != CodeKVTransferFailed || res.err.Type != "server_error" {
		t.Fatalf("error %s, want code %s", res.raw, CodeKVTransferFailed)
	}
	if res.status != http.StatusOK && res.status != http.StatusInternalServerError {
		t.Fatalf("status %d", res.status)
	}
}

func bodyFor(api API, prompt, extra string) string {
	if api == APIChat {
		return chatJSON(extra, "user", prompt)
	}
	return completionJSON(prompt, extra)
}

func with(extra, more string) string {
	if extra == "" {
		return more
	}
	return extra + "," + more
}

const vllmPrefillParams = `"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,` +
	`"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// vllmPrefill runs a router-style prefill leg and returns its
// kv_transfer_params.
func vllmPrefill(t *testing.T, url string, api API, prompt string) json.RawMessage {
	t.Helper()
	res := do(t, t.Context(), url, api, bodyFor(api, prompt, vllmPrefillParams))
	res.matches(t, api, bodyFor(api, prompt, `"max_tokens":1`))
	if len(res.kv) == 0 {
		t.Fatalf("no kv_transfer_params in %s", res.raw)
	}
	return res.kv
}

func TestVLLMHandoff(t *testing.T) {
	pe, psrv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	_, dsrv := pdEngine(t, pdConfig(RoleDecode, PDVLLM))
	for _, api := range []API{APIChat, APICompletion} {
		for _, extra := range []string{`"max_tokens":30`, `"max_tokens":30,"stream":true,"stream_options":{"include_usage":true}`, `"stop":" the"`} {
			t.Run(api.String()+" "+extra, func(t *testing.T) {
				prompt := "tell me a story about " + extra
				kv := vllmPrefill(t, psrv.URL, api, prompt)
				var got map[string]any
				if err := json.Unmarshal(kv, &got); err != nil {
					t.Fatal(err)
				}
				if got[FieldDoRemotePrefill] != true || got[FieldDoRemoteDecode] != false ||
					got[FieldRemoteEngineID] != pe.EngineID() || got[FieldRemoteHost] != "127.0.0.1" ||
					got[FieldRemotePort] != float64(pe.BootstrapPort()) || got[FieldTPSize] != float64(1) {
					t.Fatalf("kv_transfer_params %s", kv)
				}
				if ids, ok := got[FieldRemoteBlockIDs].([]any); !ok || len(ids) == 0 {
					t.Fatalf("remote_block_ids in %s", kv)
				}
				res := do(t, t.Context(), dsrv.URL, api, bodyFor(api, prompt, with(extra, `"kv_transfer_params":`+string(kv))))
				res.matches(t, api, bodyFor(api, prompt, extra))
			})
		}
	}
}

// The in-process API carries the prefill's kv_transfer_params in the usage
// chunk, and a decode through Stream matches Expect.
func TestVLLMHandoffStream(t *testing.T) {
	pe, _ := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	de, _ := pdEngine(t, pdConfig(RoleDecode, PDVLLM))
	var kv json.RawMessage
	err := pe.Stream(t.Context(), APIChat, []byte(chatJSON(vllmPrefillParams, "user", "hello")), func(c []byte) error {
		var v struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(c, &v); err != nil {
			return err
		}
		if v.KV != nil {
			kv = bytes.Clone(v.KV)
		}
		return nil
	})
	if err != nil || kv == nil {
		t.Fatalf("prefill: %v, kv %s", err, kv)
	}
	tr, err := stream(t, de, APIChat, chatJSON(`"max_tokens":12,"kv_transfer_params":`+string(kv), "user", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	if x := mustExpect(t, APIChat, chatJSON(`"max_tokens":12`, "user", "hello")); tr.text() != x.Text || tr.usage.CompletionTokens != x.CompletionTokens {
		t.Fatalf("got %q %+v, want %q", tr.text(), tr.usage, x.Text)
	}
}

func TestVLLMRefusals(t *testing.T) {
	_, psrv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	_, dsrv := pdEngine(t, pdConfig(RoleDecode, PDVLLM))
	valid := map[string]any{
		FieldDoRemotePrefill: true, FieldDoRemoteDecode: false, FieldRemoteEngineID: "sim-x",
		FieldRemoteBlockIDs: []int{1}, FieldRemoteHost: "127.0.0.1", FieldRemotePort: 9, FieldTPSize: 1,
	}
	params := func(k string, v any) string {
		m := map[string]any{}
		for k, v := range valid {
			m[k] = v
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return `"kv_transfer_params":` + string(b)
	}
	tests := []struct {
		name  string
		url   string
		extra string
		param string
	}{
		{"prefill without params", psrv.URL, `"max_tokens":1`, FieldKVTransferParams},
		{"prefill without do_remote_decode", psrv.URL, `"kv_transfer_params":{"do_remote_decode":false}`, FieldKVTransferParams},
		{"prefill streaming", psrv.URL, `"stream":true,"kv_transfer_params":{"do_remote_decode":true}`, "stream"},
		{"prefill params not an object", psrv.URL, `"kv_transfer_params":"yes"`, FieldKVTransferParams},
		{"decode without params", dsrv.URL, `"max_tokens":3`, FieldKVTransferParams},
		{"decode null params", dsrv.URL, `"kv_transfer_params":null`, FieldKVTransferParams},
		{"decode without do_remote_prefill", dsrv.URL, params(FieldDoRemotePrefill, false), FieldKVTransferParams},
		{"decode with do_remote_decode", dsrv.URL, params(FieldDoRemoteDecode, true), FieldKVTransferParams},
		{"decode without engine id", dsrv.URL, params(FieldRemoteEngineID, nil), FieldKVTransferParams},
		{"decode without blocks", dsrv.URL, params(FieldRemoteBlockIDs, []int{}), FieldKVTransferParams},
		{"decode string blocks", dsrv.URL, params(FieldRemoteBlockIDs, "1,2"), FieldKVTransferParams},
		{"decode without host", dsrv.URL, params(FieldRemoteHost, nil), FieldKVTransferParams},
		{"decode bad port", dsrv.URL, params(FieldRemotePort, 70000), FieldKVTransferParams},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := do(t, t.Context(), tc.url, APICompletion, completionJSON("hi", tc.extra))
			if res.status != http.StatusBadRequest || res.err.Param == nil || *res.err.Param != tc.param {
				t.Fatalf("%d %s, want 400 param %s", res.status, res.raw, tc.param)
			}
		})
	}
}

func TestVLLMForgedHandoff(t *testing.T) {
	pe, psrv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	de, dsrv := pdEngine(t, pdConfig(RoleDecode, PDVLLM))
	const prompt = "what is the capital of france"
	kv := vllmPrefill(t, psrv.URL, APICompletion, prompt)
	var real KVTransferParams
	if err := json.Unmarshal(kv, &real); err != nil {
		t.Fatal(err)
	}
	forge := func(f func(*KVTransferParams)) string {
		p := real
		p.RemoteBlockIDs = append([]int(nil), real.RemoteBlockIDs...)
		f(&p)
		b, _ := json.Marshal(p)
		return `"kv_transfer_params":` + string(b)
	}
	tests := []struct {
		name, prompt, extra string
	}{
		{"wrong block ids", prompt, forge(func(p *KVTransferParams) { p.RemoteBlockIDs[0] += 1000 })},
		{"extra block id", prompt, forge(func(p *KVTransferParams) { p.RemoteBlockIDs = append(p.RemoteBlockIDs, 99999) })},
		{"wrong engine id", prompt, forge(func(p *KVTransferParams) { p.RemoteEngineID = "sim-someone-else" })},
		{"other prompt", "what is the capital of spain", forge(func(*KVTransferParams) {})},
		{"other prompt streaming", "what is the capital of spain", `"stream":true,` + forge(func(*KVTransferParams) {})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			do(t, t.Context(), dsrv.URL, APICompletion, completionJSON(tc.prompt, tc.extra)).kvFailed(t)
		})
	}
	if got := de.KVTransferFailures(); got != int64(len(tests)) {
		t.Fatalf("KVTransferFailures %d, want %d", got, len(tests))
	}
	if _, metrics := get(t, dsrv.URL+"/metrics"); !strings.Contains(metrics,
		fmt.Sprintf(`switchyard_sim_kv_transfer_failures_total{model_name="sim-model"} %d`, len(tests))) {
		t.Fatalf("/metrics:\n%s", metrics)
	}

	// The forgeries did not consume the real hand-off; the real decode
	// does, so a replay fails.
	real1 := completionJSON(prompt, `"max_tokens":8,`+forge(func(*KVTransferParams) {}))
	do(t, t.Context(), dsrv.URL, APICompletion, real1).matches(t, APICompletion, completionJSON(prompt, `"max_tokens":8`))
	do(t, t.Context(), dsrv.URL, APICompletion, real1).kvFailed(t)
	if pe.Aborted() != 0 || de.Aborted() != 0 {
		t.Fatalf("aborted %d %d", pe.Aborted(), de.Aborted())
	}
}

// A decode whose prefill engine has gone fails at once, not at a timeout:
// the decode's BootstrapTimeout is an hour and the request's context ends
// far earlier than that.
func TestVLLMPrefillClosed(t *testing.T) {
	pe, psrv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	dcfg := pdConfig(RoleDecode, PDVLLM)
	dcfg.BootstrapTimeout = time.Hour
	_, dsrv := pdEngine(t, dcfg)
	kv := vllmPrefill(t, psrv.URL, APIChat, "hello")
	if err := pe.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, extra := range []string{"", `"stream":true,`} {
		do(t, ctx, dsrv.URL, APIChat, chatJSON(extra+`"kv_transfer_params":`+string(kv), "user", "hello")).kvFailed(t)
	}
}

func sglangFields(port int, room string) string {
	return fmt.Sprintf(`"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":%s`, port, room)
}

func TestSGLangHandoff(t *testing.T) {
	pcfg := pdConfig(RolePrefill, PDSGLang)
	pcfg.TTFT = 20 * time.Millisecond // the decode usually waits
	pe, psrv := pdEngine(t, pcfg)
	de, dsrv := pdEngine(t, pdConfig(RoleDecode, PDSGLang))
	rooms := []string{"0", "9223372036854775807", "9223372036854775806", "18446744073709551615"}
	n := 0
	for _, api := range []API{APIChat, APICompletion} {
		for _, extra := range []string{`"max_tokens":25`, `"max_tokens":25,"stream":true,"stream_options":{"include_usage":true}`} {
			for _, order := range []string{"concurrent", "decode first", "prefill first"} {
				room := rooms[n%len(rooms)]
				n++
				t.Run(fmt.Sprintf("%s %s %s room %s", api, extra, order, room), func(t *testing.T) {
					prompt := "explain " + order
					body := bodyFor(api, prompt, with(extra, sglangFields(pe.BootstrapPort(), room)))
					var prefill <-chan exchange
					switch order {
					case "concurrent":
						prefill = goFetch(t.Context(), psrv.URL, api, body)
					case "prefill first":
						x := fetch(t.Context(), psrv.URL, api, body)
						ch := make(chan exchange, 1)
						ch <- x
						prefill = ch
					}
					decode := goFetch(t.Context(), dsrv.URL, api, body)
					if order == "decode first" {
						testwait.For(t, 10*time.Second, time.Millisecond, func() error {
							if l := de.Load(); l.Running != 1 {
								return fmt.Errorf("decode load %+v", l)
							}
							return nil
						})
						prefill = goFetch(t.Context(), psrv.URL, api, body)
					}
					parse(t, api, <-decode).matches(t, api, bodyFor(api, prompt, extra))
					parse(t, api, <-prefill).matches(t, api, bodyFor(api, prompt, with(extra, `"max_tokens":1`)))
				})
			}
		}
	}
}

func TestSGLangRoomNeverAppears(t *testing.T) {
	pe, _ := pdEngine(t, pdConfig(RolePrefill, PDSGLang))
	dcfg := pdConfig(RoleDecode, PDSGLang)
	dcfg.BootstrapTimeout = 200 * time.Millisecond
	de, dsrv := pdEngine(t, dcfg)
	for _, extra := range []string{"", `"stream":true,`} {
		res := do(t, t.Context(), dsrv.URL, APIChat, chatJSON(extra+sglangFields(pe.BootstrapPort(), "42"), "user", "hi"))
		res.kvFailed(t)
		if !strings.Contains(res.err.Message, "did not appear") {
			t.Fatalf("message %q", res.err.Message)
		}
	}
	if de.Load() != (Load{}) || de.Aborted() != 0 {
		t.Fatalf("load %+v aborted %d", de.Load(), de.Aborted())
	}
}

// A cancelled prefill fails its room, and a decode waiting on it fails at
// once: both timeouts are an hour, the decode request's context 30s.
func TestSGLangCancelledPrefill(t *testing.T) {
	pcfg := pdConfig(RolePrefill, PDSGLang)
	pcfg.TTFT = time.Hour
	pe, psrv := pdEngine(t, pcfg)
	dcfg := pdConfig(RoleDecode, PDSGLang)
	dcfg.BootstrapTimeout = time.Hour
	de, dsrv := pdEngine(t, dcfg)
	body := chatJSON(`"stream":true,`+sglangFields(pe.BootstrapPort(), "7"), "user", "hi")

	dctx, dcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer dcancel()
	decode := goFetch(dctx, dsrv.URL, APIChat, body)

	pctx, pcancel := context.WithCancel(t.Context())
	defer pcancel()
	go func() {
		req, _ := http.NewRequestWithContext(pctx, http.MethodPost, psrv.URL+path(APIChat), strings.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if pl, dl := pe.Load(), de.Load(); pl.Running != 1 || dl.Running != 1 {
			return fmt.Errorf("prefill %+v decode %+v", pl, dl)
		}
		return nil
	})
	pcancel()
	res := parse(t, APIChat, <-decode)
	res.kvFailed(t)
	if !strings.Contains(res.err.Message, "failed") {
		t.Fatalf("message %q", res.err.Message)
	}
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if pe.Aborted() != 1 || pe.Load().Running != 0 || de.Load().Running != 0 {
			return fmt.Errorf("prefill aborted %d load %+v, decode load %+v", pe.Aborted(), pe.Load(), de.Load())
		}
		return nil
	})
}

// A cancelled decode waiting for its room counts as aborted.
func TestSGLangCancelledDecode(t *testing.T) {
	pe, _ := pdEngine(t, pdConfig(RolePrefill, PDSGLang))
	dcfg := pdConfig(RoleDecode, PDSGLang)
	dcfg.BootstrapTimeout = time.Hour
	de := newTestEngine(t, dcfg)
	t.Cleanup(func() { _ = de.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- de.Stream(ctx, APICompletion, []byte(completionJSON("hi", sglangFields(pe.BootstrapPort(), "5"))),
			func([]byte) error { return errors.New("emit called") })
	}()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if l := de.Load(); l.Running != 1 {
			return fmt.Errorf("load %+v", l)
		}
		return nil
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if de.Aborted() != 1 || de.KVTransferFailures() != 0 || de.Load().Running != 0 {
		t.Fatalf("aborted %d failures %d load %+v", de.Aborted(), de.KVTransferFailures(), de.Load())
	}
}

func TestSGLangMismatch(t *testing.T) {
	pe, psrv := pdEngine(t, pdConfig(RolePrefill, PDSGLang))
	_, dsrv := pdEngine(t, pdConfig(RoleDecode, PDSGLang))
	fields := sglangFields(pe.BootstrapPort(), "11")
	do(t, t.Context(), psrv.URL, APICompletion, completionJSON("one prompt", fields))
	res := do(t, t.Context(), dsrv.URL, APICompletion, completionJSON("another prompt", fields))
	res.kvFailed(t)
	// The mismatch did not consume the room.
	do(t, t.Context(), dsrv.URL, APICompletion, completionJSON("one prompt", fields)).
		matches(t, APICompletion, completionJSON("one prompt", ""))
}

func TestSGLangRefusals(t *testing.T) {
	pcfg := pdConfig(RolePrefill, PDSGLang)
	pcfg.TTFT = time.Hour
	pe, psrv := pdEngine(t, pcfg)
	_, dsrv := pdEngine(t, pdConfig(RoleDecode, PDSGLang))
	port := pe.BootstrapPort()
	tests := []struct {
		name, extra, param string
	}{
		{"no fields", `"max_tokens":2`, FieldBootstrapHost},
		{"no host", fmt.Sprintf(`"bootstrap_port":%d,"bootstrap_room":1`, port), FieldBootstrapHost},
		{"no port", `"bootstrap_host":"127.0.0.1","bootstrap_room":1`, FieldBootstrapPort},
		{"null port", `"bootstrap_host":"127.0.0.1","bootstrap_port":null,"bootstrap_room":1`, FieldBootstrapPort},
		{"no room", fmt.Sprintf(`"bootstrap_host":"127.0.0.1","bootstrap_port":%d`, port), FieldBootstrapRoom},
		{"empty host", fmt.Sprintf(`"bootstrap_host":"","bootstrap_port":%d,"bootstrap_room":1`, port), FieldBootstrapHost},
		{"port string", `"bootstrap_host":"127.0.0.1","bootstrap_port":"8998","bootstrap_room":1`, FieldBootstrapPort},
		{"negative room", sglangFields(port, "-1"), FieldBootstrapRoom},
		{"fractional room", sglangFields(port, "1.5"), FieldBootstrapRoom},
		{"room too big", sglangFields(port, "18446744073709551616"), FieldBootstrapRoom},
		{"room string", sglangFields(port, `"1"`), FieldBootstrapRoom},
	}
	for _, tc := range tests {
		for _, srv := range []*httptest.Server{psrv, dsrv} {
			t.Run(tc.name, func(t *testing.T) {
				res := do(t, t.Context(), srv.URL, APICompletion, completionJSON("hi", tc.extra))
				if res.status != http.StatusBadRequest || res.err.Param == nil || *res.err.Param != tc.param {
					t.Fatalf("%d %s, want 400 param %s", res.status, res.raw, tc.param)
				}
			})
		}
	}

	// A room in use by a running prefill is refused.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	body := completionJSON("hi", `"stream":true,`+sglangFields(port, "3"))
	resp := post(t, ctx, psrv.URL+"/v1/completions", body)
	defer resp.Body.Close()
	res := do(t, t.Context(), psrv.URL, APICompletion, body)
	if res.status != http.StatusBadRequest || *res.err.Param != FieldBootstrapRoom {
		t.Fatalf("%d %s", res.status, res.raw)
	}
}

// Regular engines ignore PD fields, whatever their shape.
func TestRegularIgnoresPDFields(t *testing.T) {
	e := newTestEngine(t, testConfig())
	srv := newTestServer(t, e)
	if e.Role() != RoleRegular || e.PDProtocol() != "" || e.BootstrapAddr() != "" || e.Close() != nil {
		t.Fatalf("role %q protocol %q bootstrap %q", e.Role(), e.PDProtocol(), e.BootstrapAddr())
	}
	for _, pd := range []string{
		vllmPrefillParams,
		`"max_tokens":1,"kv_transfer_params":"odd","bootstrap_room":-3,"bootstrap_port":"x","bootstrap_host":5`,
	} {
		do(t, t.Context(), srv.URL, APIChat, chatJSON(pd, "user", "hi")).matches(t, APIChat, chatJSON(`"max_tokens":1`, "user", "hi"))
	}
}

func TestPDConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*Config)
		ok   bool
	}{
		{"prefill vllm", func(c *Config) { c.Role, c.PDProtocol, c.BootstrapPort = RolePrefill, PDVLLM, 0 }, true},
		{"decode sglang", func(c *Config) { c.Role, c.PDProtocol = RoleDecode, PDSGLang }, true},
		{"empty role", func(c *Config) { c.Role = "" }, true},
		{"regular ignores protocol", func(c *Config) { c.PDProtocol = "" }, true},
		{"bad role", func(c *Config) { c.Role = "both" }, false},
		{"decode no protocol", func(c *Config) { c.Role, c.PDProtocol = RoleDecode, "" }, false},
		{"decode bad protocol", func(c *Config) { c.Role, c.PDProtocol = RoleDecode, "nixl" }, false},
		{"bad port", func(c *Config) { c.BootstrapPort = 65536 }, false},
		{"negative timeout", func(c *Config) { c.BootstrapTimeout = -1 }, false},
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
			if err == nil {
				e, err := New(c)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				defer e.Close()
				if want := c.Role; want != "" && e.Role() != want {
					t.Fatalf("Role %q", e.Role())
				}
			}
		})
	}
}

func TestBootstrapServer(t *testing.T) {
	pe, _ := pdEngine(t, pdConfig(RolePrefill, PDSGLang))
	if pe.BootstrapPort() == 0 || pe.BootstrapAddr() != fmt.Sprintf("127.0.0.1:%d", pe.BootstrapPort()) {
		t.Fatalf("BootstrapAddr %q port %d", pe.BootstrapAddr(), pe.BootstrapPort())
	}
	if code, _ := get(t, "http://"+pe.BootstrapAddr()+PathBootstrapHealth); code != 200 {
		t.Fatalf("health %d", code)
	}
	code, body := get(t, "http://"+pe.BootstrapAddr()+PathSGLangRoom+"9?wait=1ms")
	if code != 404 || !strings.Contains(body, `"unknown"`) {
		t.Fatalf("room poll %d %s", code, body)
	}
	if err := pe.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pe.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
