package simengine

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/vllmpb"
)

// GRPCServer returns a gRPC server serving [Engine.RegisterGRPC]'s
// service; the caller runs it with Serve and stops it.
func (e *Engine) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(opts...)
	e.RegisterGRPC(s)
	return s
}

// RegisterGRPC registers vLLM's gRPC engine service,
// vllm.grpc.engine.VllmEngine, on s. It runs requests exactly as the HTTP
// API does (same slots, timing, output, abort counting and PD checks), with
// these mappings:
//
//   - The text input is the prompt as a completion request's prompt; a
//     tokenized input is decoded with [SimTokenizer] first. No chat
//     template is applied.
//   - Output tokens are sent as ids of [SimTokenizer]: a stream sends one
//     chunk per generated word (several ids when the word has no token of
//     its own), then a complete with the finish reason and the counts and
//     no output_ids; a non-streaming request sends only the complete, with
//     every id. The part of a token before a stop string is sent as the ids
//     of that text and is not counted, so the decoded text is exactly what
//     the HTTP API streams ([Expect] holds).
//   - A vLLM PD engine reads kv_transfer_params_json as the HTTP API reads
//     kv_transfer_params; a prefill's complete returns the hand-off in
//     kv_transfer_params_json.
//   - A refusal is a status: 400 is InvalidArgument, 404 NotFound, a failed
//     hand-off Internal (its message starts with "kv_transfer_failed").
//   - Abort cancels the named requests, which counts them in
//     [Engine.Aborted] as a cancelled stream does.
//   - GetTokenizer streams a zip archive holding [TokenizerFile].
//   - Until the engine is loaded ([Config.LoadTime]), HealthCheck,
//     Generate, GetModelInfo and GetTokenizer fail with Unavailable;
//     GetServerInfo, GetLoads and Abort answer.
//   - Embed is unimplemented.
func (e *Engine) RegisterGRPC(s grpc.ServiceRegistrar) {
	vllmpb.RegisterVllmEngineServer(s, &grpcService{e: e, start: time.Now(), active: map[string][]*activeCall{}})
}

type grpcService struct {
	vllmpb.UnimplementedVllmEngineServer
	e     *Engine
	start time.Time

	mu     sync.Mutex
	active map[string][]*activeCall // by request id
}

type activeCall struct{ cancel context.CancelFunc }

func (g *grpcService) track(id string, c *activeCall) {
	g.mu.Lock()
	g.active[id] = append(g.active[id], c)
	g.mu.Unlock()
}

func (g *grpcService) untrack(id string, c *activeCall) {
	g.mu.Lock()
	defer g.mu.Unlock()
	list := g.active[id]
	for i, x := range list {
		if x == c {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(g.active, id)
	} else {
		g.active[id] = list
	}
}

// loading is the Unavailable status of an engine not loaded yet, or nil.
func (g *grpcService) loading() error {
	if g.e.Loaded() {
		return nil
	}
	return statusOf(g.e.loadingError())
}

func (g *grpcService) Generate(req *vllmpb.GenerateRequest, ss grpc.ServerStreamingServer[vllmpb.GenerateResponse]) error {
	if err := g.loading(); err != nil {
		return err
	}
	r, rerr := g.e.grpcRequest(req)
	if rerr != nil {
		return statusOf(rerr)
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	c := &activeCall{cancel: cancel}
	if id := req.GetRequestId(); id != "" {
		g.track(id, c)
		defer g.untrack(id, c)
	}
	o := r.outcome()
	s := &grpcSink{ss: ss, stream: r.stream, tok: SimTokenizer(), limit: o.tokens, prompt: o.promptTokens}
	if err := g.e.run(ctx, r, s); err != nil {
		return statusOf(err)
	}
	return nil
}

// grpcRequest turns a GenerateRequest into the engine's request.
func (e *Engine) grpcRequest(req *vllmpb.GenerateRequest) (*request, *Error) {
	r := &request{api: APICompletion, stream: req.GetStream(), includeUsage: true, n: 1}
	switch in := req.GetInput().(type) {
	case *vllmpb.GenerateRequest_Text:
		r.prompt = in.Text
	case *vllmpb.GenerateRequest_Tokenized:
		b, err := SimTokenizer().Decode(in.Tokenized.GetInputIds())
		if err != nil {
			return nil, badRequest("tokenized", "%v", err)
		}
		r.prompt = string(b)
	default:
		return nil, badRequest("input", "text or tokenized input is required")
	}
	sp := req.GetSamplingParams()
	r.maxTokens = DefaultMaxTokens
	if sp != nil && sp.MaxTokens != nil {
		if m := sp.GetMaxTokens(); m < 1 || m > MaxTokensLimit {
			return nil, badRequest("max_tokens", "max_tokens must be between 1 and %d, got %d", MaxTokensLimit, m)
		} else {
			r.maxTokens = int(m)
		}
	}
	if n := sp.GetN(); n > 1 {
		return nil, badRequest("n", "n must be 1 over the gRPC engine service, got %d", n)
	}
	for _, s := range sp.GetStop() {
		if s != "" {
			r.stops = append(r.stops, s)
		}
	}
	if req.KvTransferParamsJson != nil {
		r.pdRaw.KVTransferParams = json.RawMessage(req.GetKvTransferParamsJson())
	}
	if e.cfg.Role != RoleRegular {
		if err := e.checkPD(r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// statusOf maps an engine error to a gRPC status.
func statusOf(err error) error {
	var e *Error
	switch {
	case errors.As(err, &e):
		code := codes.Internal
		switch {
		case e.Status == http.StatusNotFound:
			code = codes.NotFound
		case e.Status == http.StatusTooManyRequests:
			code = codes.ResourceExhausted
		case e.Status == http.StatusServiceUnavailable:
			code = codes.Unavailable
		case e.Status >= 400 && e.Status < 500:
			code = codes.InvalidArgument
		}
		msg := e.Message
		if e.Code != "" {
			msg = e.Code + ": " + msg
		}
		return status.Error(code, msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}

// grpcSink sends one generation as GenerateResponse messages.
type grpcSink struct {
	ss     grpc.ServerStreamingServer[vllmpb.GenerateResponse]
	stream bool
	tok    *Tokenizer
	limit  int // whole tokens the generation counts
	sent   int
	ids    []uint32 // non-streaming: every id
	prompt int
	reason string
}

func (s *grpcSink) open() error  { return nil }
func (s *grpcSink) first() error { return nil }

func (s *grpcSink) token(_ int, text, _ string) error {
	ids, err := s.tok.Encode(text)
	if err != nil {
		return err
	}
	s.sent = min(s.sent+1, s.limit) // a stop string's partial token is not counted
	if !s.stream {
		s.ids = append(s.ids, ids...)
		return nil
	}
	return s.ss.Send(&vllmpb.GenerateResponse{Response: &vllmpb.GenerateResponse_Chunk{Chunk: &vllmpb.GenerateStreamChunk{
		TokenIds:         ids,
		PromptTokens:     uint32(s.prompt),
		CompletionTokens: uint32(s.sent),
	}}})
}

func (s *grpcSink) stop(_ int, reason string, _ []byte) error {
	s.reason = reason
	return nil
}

func (s *grpcSink) finish(u usageCounts, extra []byte) error {
	c := &vllmpb.GenerateComplete{
		OutputIds:        s.ids,
		FinishReason:     s.reason,
		PromptTokens:     uint32(u.prompt),
		CompletionTokens: uint32(u.completion),
		CachedTokens:     uint32(max(0, u.cached)),
	}
	// extra is `,"kv_transfer_params":{...}` for a vLLM prefill.
	if kv, ok := bytes.CutPrefix(extra, []byte(`,"`+FieldKVTransferParams+`":`)); ok {
		js := string(kv)
		c.KvTransferParamsJson = &js
	}
	return s.ss.Send(&vllmpb.GenerateResponse{Response: &vllmpb.GenerateResponse_Complete{Complete: c}})
}

func (g *grpcService) Abort(_ context.Context, req *vllmpb.AbortRequest) (*vllmpb.AbortResponse, error) {
	g.mu.Lock()
	var cancels []context.CancelFunc
	for _, id := range req.GetRequestIds() {
		for _, c := range g.active[id] {
			cancels = append(cancels, c.cancel)
		}
	}
	g.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	return &vllmpb.AbortResponse{}, nil
}

func (g *grpcService) HealthCheck(context.Context, *vllmpb.HealthCheckRequest) (*vllmpb.HealthCheckResponse, error) {
	if err := g.loading(); err != nil {
		return nil, err
	}
	return &vllmpb.HealthCheckResponse{Healthy: true, Message: "ok"}, nil
}

func (g *grpcService) GetModelInfo(context.Context, *vllmpb.GetModelInfoRequest) (*vllmpb.GetModelInfoResponse, error) {
	if err := g.loading(); err != nil {
		return nil, err
	}
	return &vllmpb.GetModelInfoResponse{
		ModelPath:        g.e.cfg.Model,
		ServedModelName:  g.e.cfg.Model,
		IsGeneration:     true,
		MaxContextLength: MaxTokensLimit,
		VocabSize:        uint32(SimTokenizer().Size()),
		ModelType:        "switchyard-sim",
	}, nil
}

func (g *grpcService) GetServerInfo(context.Context, *vllmpb.GetServerInfoRequest) (*vllmpb.GetServerInfoResponse, error) {
	l := g.e.Load()
	info := &vllmpb.GetServerInfoResponse{
		ActiveRequests:   uint32(l.Running + l.Waiting),
		UptimeSeconds:    time.Since(g.start).Seconds(),
		ServerType:       "vllm-grpc",
		DataParallelSize: 1,
	}
	if g.e.cfg.PDProtocol == PDVLLM {
		info.KvConnector, info.KvEngineId = "NixlConnector", g.e.engineID
		info.KvRole = "kv_consumer"
		if g.e.cfg.Role == RolePrefill {
			info.KvRole = "kv_producer"
		}
	}
	return info, nil
}

func (g *grpcService) GetLoads(context.Context, *vllmpb.GetLoadsRequest) (*vllmpb.GetLoadsResponse, error) {
	l := g.e.Load()
	return &vllmpb.GetLoadsResponse{
		Timestamp:   time.Now().UTC().Format(time.RFC3339Nano),
		Version:     "switchyard-sim",
		DpRankCount: 1,
		Loads: []*vllmpb.SchedulerLoad{{
			NumRunningReqs:     int32(l.Running),
			NumWaitingReqs:     int32(l.Waiting),
			NumTotalReqs:       int32(l.Running + l.Waiting),
			TokenUsage:         l.KVUsage,
			Utilization:        l.KVUsage,
			MaxRunningRequests: int32(g.e.cfg.Slots),
		}},
	}, nil
}

// tokenizerChunkSize is the data size of one GetTokenizer message.
const tokenizerChunkSize = 32 << 10

var tokenizerZip = sync.OnceValues(func() ([]byte, error) {
	js, err := SimTokenizer().MarshalJSON()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	w, err := zw.Create(TokenizerFile)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(js); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
})

func (g *grpcService) GetTokenizer(_ *vllmpb.GetTokenizerRequest, ss grpc.ServerStreamingServer[vllmpb.GetTokenizerChunk]) error {
	if err := g.loading(); err != nil {
		return err
	}
	data, err := tokenizerZip()
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	sum := sha256.Sum256(data)
	for off := 0; off < len(data); off += tokenizerChunkSize {
		end := min(off+tokenizerChunkSize, len(data))
		c := &vllmpb.GetTokenizerChunk{Data: data[off:end]}
		if end == len(data) {
			c.Sha256 = hex.EncodeToString(sum[:])
		}
		if err := ss.Send(c); err != nil {
			return err
		}
	}
	return nil
}
