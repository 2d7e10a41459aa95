package simengine

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/vllmpb"
)

func grpcClient(t *testing.T, e *Engine) vllmpb.VllmEngineClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := e.GRPCServer()
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return vllmpb.NewVllmEngineClient(conn)
}

// generate runs req and returns the decoded text and the complete.
func generate(t *testing.T, ctx context.Context, c vllmpb.VllmEngineClient, req *vllmpb.GenerateRequest) (string, *vllmpb.GenerateComplete, error) {
	t.Helper()
	st, err := c.Generate(ctx, req)
	if err != nil {
		return "", nil, err
	}
	var ids []uint32
	for {
		resp, err := st.Recv()
		if err != nil {
			return "", nil, err
		}
		if ch := resp.GetChunk(); ch != nil {
			ids = append(ids, ch.GetTokenIds()...)
			continue
		}
		comp := resp.GetComplete()
		ids = append(ids, comp.GetOutputIds()...)
		b, err := SimTokenizer().Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), comp, nil
	}
}

func u32(n uint32) *uint32 { return &n }

func TestGRPCMatchesExpect(t *testing.T) {
	c := grpcClient(t, newTestEngine(t, testConfig()))
	for _, tc := range []struct {
		name   string
		prompt string
		max    uint32
		stop   []string
		stream bool
	}{
		{"stream", "Once upon a time", 20, nil, true},
		{"unary", "Once upon a time", 20, nil, false},
		{"long", "the quick brown fox", 200, nil, true},
		{"stop in a token", "Once upon a time", 40, []string{"e"}, true},
		{"stop unary", "hello there", 40, []string{"th"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := completionJSON(tc.prompt, `"max_tokens":`+itoa(int(tc.max)))
			if tc.stop != nil {
				body = completionJSON(tc.prompt, `"max_tokens":`+itoa(int(tc.max))+`,"stop":`+jsonString(tc.stop[0]))
			}
			x := mustExpect(t, APICompletion, body)
			text, comp, err := generate(t, t.Context(), c, &vllmpb.GenerateRequest{
				RequestId:      "r1",
				Input:          &vllmpb.GenerateRequest_Text{Text: tc.prompt},
				SamplingParams: &vllmpb.SamplingParams{MaxTokens: u32(tc.max), Stop: tc.stop},
				Stream:         tc.stream,
			})
			if err != nil {
				t.Fatal(err)
			}
			if text != x.Text || comp.GetFinishReason() != x.FinishReason ||
				int(comp.GetPromptTokens()) != x.PromptTokens || int(comp.GetCompletionTokens()) != x.CompletionTokens {
				t.Fatalf("got %q %s %d/%d, want %q %s %d/%d", text, comp.GetFinishReason(), comp.GetPromptTokens(), comp.GetCompletionTokens(),
					x.Text, x.FinishReason, x.PromptTokens, x.CompletionTokens)
			}
		})
	}
}

func TestGRPCTokenizedInput(t *testing.T) {
	c := grpcClient(t, newTestEngine(t, testConfig()))
	ids, err := SimTokenizer().Encode("user: café 日本\nassistant:")
	if err != nil {
		t.Fatal(err)
	}
	text, _, err := generate(t, t.Context(), c, &vllmpb.GenerateRequest{
		Input:          &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: ids}},
		SamplingParams: &vllmpb.SamplingParams{MaxTokens: u32(8)},
		Stream:         true,
	})
	if err != nil {
		t.Fatal(err)
	}
	x := mustExpect(t, APICompletion, completionJSON("user: café 日本\nassistant:", `"max_tokens":8`))
	if text != x.Text {
		t.Fatalf("got %q, want %q", text, x.Text)
	}
}

func TestGRPCRefusals(t *testing.T) {
	c := grpcClient(t, newTestEngine(t, testConfig()))
	for _, tc := range []struct {
		name string
		req  *vllmpb.GenerateRequest
	}{
		{"no input", &vllmpb.GenerateRequest{}},
		{"max tokens 0", &vllmpb.GenerateRequest{Input: &vllmpb.GenerateRequest_Text{Text: "x"}, SamplingParams: &vllmpb.SamplingParams{MaxTokens: u32(0)}}},
		{"n 2", &vllmpb.GenerateRequest{Input: &vllmpb.GenerateRequest_Text{Text: "x"}, SamplingParams: &vllmpb.SamplingParams{N: 2}}},
		{"unknown token", &vllmpb.GenerateRequest{Input: &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: []uint32{1 << 20}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := generate(t, t.Context(), c, tc.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
		})
	}
}

func TestGRPCAbort(t *testing.T) {
	cfg := testConfig()
	cfg.ITL = 5 * time.Millisecond
	e := newTestEngine(t, cfg)
	c := grpcClient(t, e)
	st, err := c.Generate(t.Context(), &vllmpb.GenerateRequest{
		RequestId: "slow", Input: &vllmpb.GenerateRequest_Text{Text: "x"},
		SamplingParams: &vllmpb.SamplingParams{MaxTokens: u32(100000)}, Stream: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Abort(t.Context(), &vllmpb.AbortRequest{RequestIds: []string{"slow"}}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := st.Recv()
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) || status.Code(err) != codes.Canceled {
			t.Fatalf("stream ended with %v, want Canceled", err)
		}
		break
	}
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if e.Aborted() != 1 {
			return errors.New("not aborted yet")
		}
		return nil
	})
}

func TestGRPCInfo(t *testing.T) {
	e := newTestEngine(t, testConfig())
	c := grpcClient(t, e)
	ctx := t.Context()
	h, err := c.HealthCheck(ctx, &vllmpb.HealthCheckRequest{})
	if err != nil || !h.GetHealthy() {
		t.Fatalf("health %v %v", h, err)
	}
	l, err := c.GetLoads(ctx, &vllmpb.GetLoadsRequest{})
	if err != nil || len(l.GetLoads()) != 1 || l.GetLoads()[0].GetMaxRunningRequests() != 4 {
		t.Fatalf("loads %v %v", l, err)
	}
	mi, err := c.GetModelInfo(ctx, &vllmpb.GetModelInfoRequest{})
	if err != nil || mi.GetServedModelName() != "sim-model" || int(mi.GetVocabSize()) != SimTokenizer().Size() {
		t.Fatalf("model info %v %v", mi, err)
	}
	st, err := c.GetTokenizer(ctx, &vllmpb.GetTokenizerRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, ch.GetData()...)
	}
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := zr.Open(TokenizerFile)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := io.ReadAll(f)
	tok, err := ParseTokenizer(js)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Size() != SimTokenizer().Size() {
		t.Fatalf("size %d, want %d", tok.Size(), SimTokenizer().Size())
	}
}

func TestTokenizer(t *testing.T) {
	tok := SimTokenizer()
	split, multi := 0, 0
	for _, s := range tokenText {
		ids, err := tok.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 1 {
			split++
		}
		if b, _ := tok.Decode(ids); string(b) != s {
			t.Fatalf("%q round trips to %q", s, b)
		}
	}
	for _, s := range []string{" café", " naïve", " 日本", "plain ascii and ünïcödé ✓"} {
		ids, err := tok.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if b, _ := tok.Token(id); !strings.HasPrefix(s, "plain") && len(b) > 0 && !isValid(b) {
				multi++
			}
		}
		if b, _ := tok.Decode(ids); string(b) != s {
			t.Fatalf("%q round trips to %q", s, b)
		}
	}
	if split == 0 || multi == 0 {
		t.Fatalf("split words %d, tokens splitting a character %d: want both > 0", split, multi)
	}
	js, err := tok.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseTokenizer(js)
	if err != nil {
		t.Fatal(err)
	}
	for id := range tok.Size() {
		a, _ := tok.Token(uint32(id))
		b, _ := back.Token(uint32(id))
		if !bytes.Equal(a, b) {
			t.Fatalf("token %d: %q != %q", id, a, b)
		}
	}
}

func isValid(b []byte) bool { return strings.ToValidUTF8(string(b), "\x00") == string(b) }

// With the prefix cache on, GenerateComplete counts the cached prompt
// tokens.
func TestGRPCCachedTokens(t *testing.T) {
	c := grpcClient(t, newTestEngine(t, cacheConfig(64, 4)))
	req := &vllmpb.GenerateRequest{
		Input:          &vllmpb.GenerateRequest_Text{Text: promptWords("g", 20)},
		SamplingParams: &vllmpb.SamplingParams{MaxTokens: u32(2)},
	}
	for _, want := range []uint32{0, 16} { // cold, then four blocks of four
		_, comp, err := generate(t, t.Context(), c, req)
		if err != nil {
			t.Fatal(err)
		}
		if comp.GetCachedTokens() != want {
			t.Fatalf("cached tokens %d, want %d", comp.GetCachedTokens(), want)
		}
	}
}
