package simengine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/oaiformat"
)

// TestPrefixCacheTokenHash: with KVHashTokens the cache and its events
// look like real vLLM's: token ids of a ChatML rendering, hashes that are
// not the broker's keys, chained from the seed.
func TestPrefixCacheTokenHash(t *testing.T) {
	cfg := cacheConfig(64, 4)
	cfg.KVHash, cfg.KVHashSeed = KVHashTokens, 7
	cfg.KVEvents = kvevents.Config{Enabled: true, Publisher: "zmq", Endpoint: "tcp://127.0.0.1:0"}
	e := newTestEngine(t, cfg)
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	got := &updates{}
	done := make(chan error, 1)
	go func() {
		done <- kvevents.NewSubscriber(e.KVEventsEndpoint(), "", kvevents.WithRetry(20*time.Millisecond)).Run(ctx, got.add)
	}()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if e.kvpub.Subscribers() == 0 {
			return fmt.Errorf("no subscriber yet")
		}
		return nil
	})
	sys := promptWords("s", 12)
	body := chatJSON(`"max_tokens":1`, "system", sys, "user", "hi")
	mustStream(t, e, APIChat, body)
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if len(got.events()) == 0 {
			return fmt.Errorf("no event yet")
		}
		return nil
	})
	ids, _ := SimTokenizer().Encode("<|im_start|>system\n" + sys + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
	full := len(ids) / 4 * 4
	ev := got.events()[0]
	if ev.Kind != kvevents.BlockStored || ev.HasParent || ev.BlockSize != 4 || !slices.Equal(ev.TokenIDs, ids[:full]) {
		t.Fatalf("event %+v, want BlockStored of the ChatML prompt's tokens %v", ev, ids[:full])
	}
	want := (&tokenHasher{tok: SimTokenizer(), blockSize: 4, seed: 7, ids: ids}).Keys()
	if !slices.Equal(ev.Hashes, want) {
		t.Fatalf("hashes %x, want the seeded chain %x", ev.Hashes, want)
	}
	broker := affinity.AppendChatKeys(nil, 4, []affinity.Message{{Role: "system", Content: sys}, {Role: "user", Content: "hi"}})
	for _, h := range ev.Hashes {
		if slices.Contains(broker, h) {
			t.Fatalf("hash %x is a broker key", h)
		}
	}
	// The same prompt again hits, counted in tokens.
	_, h0, _ := e.PrefixCache()
	mustStream(t, e, APIChat, body)
	if q, h, _ := e.PrefixCache(); h-h0 != int64((len(ids)-1)/4*4) {
		t.Fatalf("queries %d hits %d -> %d, want %d more hits", q, h0, h, (len(ids)-1)/4*4)
	}
}

func TestTokenizeEndpoint(t *testing.T) {
	for _, mode := range []string{KVHashBroker, KVHashTokens} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig()
			cfg.KVHash = mode
			e := newTestEngine(t, cfg)
			srv := httptest.NewServer(e.Handler())
			t.Cleanup(srv.Close)
			post := func(body string) (int, oaiformat.TokenizeResponse) {
				resp, err := http.Post(srv.URL+"/tokenize", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var out oaiformat.TokenizeResponse
				_ = json.NewDecoder(resp.Body).Decode(&out)
				return resp.StatusCode, out
			}
			code, out := post(`{"model":"sim-model","messages":[{"role":"user","content":"hello café"}],"add_generation_prompt":true,"return_token_strs":true}`)
			text, _ := oaiformat.TokenText(nil, nil, out.TokenStrs)
			wantText := "user: hello café\nassistant:"
			if mode == KVHashTokens {
				wantText = "<|im_start|>user\nhello café<|im_end|>\n<|im_start|>assistant\n"
			}
			wantIDs, _ := SimTokenizer().Encode(wantText)
			if code != http.StatusOK || string(text) != wantText || out.Count != len(out.Tokens) || !slices.Equal(out.Tokens, wantIDs) {
				t.Fatalf("status %d, %+v decoding to %q, want %q", code, out, text, wantText)
			}
			code, out = post(`{"prompt":"once upon"}`)
			if code != http.StatusOK || out.Count != len(out.Tokens) || out.TokenStrs != nil || out.MaxModelLen == 0 {
				t.Fatalf("completion form: status %d, %+v", code, out)
			}
			if code, _ := post(`{"model":"other","prompt":"x"}`); code != http.StatusNotFound {
				t.Fatalf("other model: status %d", code)
			}
			if code, _ := post(`{}`); code != http.StatusBadRequest {
				t.Fatalf("no prompt: status %d", code)
			}
		})
	}
}
