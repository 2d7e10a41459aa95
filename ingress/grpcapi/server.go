package grpcapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// Backend is what the ingress needs from the broker.
type Backend interface {
	Submit(ctx context.Context, req broker.Request) (*broker.Call, error)
	Models() []string
	Ready() error
}

var _ Backend = (*broker.Broker)(nil)

// Response header metadata of Chat and Complete, the counterparts of the HTTP
// ingress's X-Request-Id, X-Switchyard-Route and X-Switchyard-Agent.
const (
	// HeaderRequestID echoes the client's x-request-id metadata, or carries
	// the id the ingress made up when the client sent none (or an unusable
	// one: longer than 128 bytes or not printable ASCII).
	HeaderRequestID = "x-request-id"
	// HeaderRoute is "regular" or "pd".
	HeaderRoute = "x-switchyard-route"
	// HeaderAgent is the agent streaming the output; on the PD route
	// "prefill-agent,decode-agent".
	HeaderAgent = "x-switchyard-agent"
)

// Defaults of Config.
const (
	// DefaultMaxRecvMsgSize matches the HTTP ingress's body limit
	// (openaihttp.DefaultMaxBody): the request travels to the agent in one
	// NATS message, and the embedded server allows 8 MiB.
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultMaxSendMsgSize leaves room for large raw chunks (logprobs,
	// tool calls); stream messages are normally a few hundred bytes.
	DefaultMaxSendMsgSize = 16 << 20
	// DefaultHealthInterval is how often a health Watch re-checks readiness.
	DefaultHealthInterval = time.Second
	// DefaultMaxHeaderListSize bounds one stream's header list
	// (uncompressed, as HPACK decodes it): the key, trace context and
	// request id need a few hundred bytes. grpc-go's own bound is 16 MiB,
	// which HPACK's indexing lets a client claim for a few bytes sent.
	DefaultMaxHeaderListSize = 16 << 10
	// DefaultMaxConcurrentStreams bounds the streams open at once on one
	// connection (HTTP/2's recommended minimum; grpc-go sets no bound).
	DefaultMaxConcurrentStreams = 100
	// DefaultIdleTimeout closes a connection with no stream open this long,
	// as the HTTP ingress's --idle-timeout does.
	DefaultIdleTimeout = 120 * time.Second
	// DefaultHandshakeTimeout bounds a new connection's TLS and HTTP/2
	// handshake (grpc-go's own is 120s).
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxWatches bounds the health Watch streams open at once.
	DefaultMaxWatches = 1024
	// WatchesPerConn bounds the health Watch streams open at once on one
	// connection: a client watching health needs one per service.
	WatchesPerConn = 8
)

// Keepalive: the broker pings a connection quiet for keepaliveTime and
// closes it when the ping is not answered within keepaliveTimeout, so a
// vanished client does not hold its streams; a client may ping every
// keepaliveMinTime, with or without a stream, and is sent away
// (GOAWAY too_many_pings) when it pings faster.
const (
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	keepaliveMinTime = 5 * time.Second
)

// Config configures the gRPC ingress; zero fields take the defaults.
type Config struct {
	// MaxRecvMsgSize bounds one request message, in bytes.
	MaxRecvMsgSize int
	// MaxSendMsgSize bounds one response message, in bytes.
	MaxSendMsgSize int
	// HealthInterval is how often the health service re-checks the
	// backend's readiness for open Watch streams. Check and List always
	// check it afresh.
	HealthInterval time.Duration
	// MaxHeaderListSize bounds one stream's header list, in bytes; a
	// stream past it is reset before it is served.
	MaxHeaderListSize int
	// MaxConcurrentStreams bounds the streams open at once on one
	// connection; the client is told in HTTP/2 SETTINGS and a stream past
	// it is refused.
	MaxConcurrentStreams int
	// IdleTimeout closes a connection (GOAWAY) that has had no stream open
	// this long.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds a new connection's TLS and HTTP/2 handshake.
	HandshakeTimeout time.Duration
	// MaxWatches bounds the health Watch streams open at once over every
	// connection; past it (or past WatchesPerConn on one connection) a
	// Watch gets codes.ResourceExhausted.
	MaxWatches int
}

func (c *Config) setDefaults() {
	if c.MaxRecvMsgSize == 0 {
		c.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if c.MaxSendMsgSize == 0 {
		c.MaxSendMsgSize = DefaultMaxSendMsgSize
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.MaxHeaderListSize == 0 {
		c.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.MaxWatches == 0 {
		c.MaxWatches = DefaultMaxWatches
	}
}

// Validate reports what is wrong with c after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.MaxRecvMsgSize < 0 || c.MaxSendMsgSize < 0 {
		errs = append(errs, fmt.Errorf("message sizes %d/%d: must not be negative", c.MaxRecvMsgSize, c.MaxSendMsgSize))
	}
	if c.HealthInterval < 0 {
		errs = append(errs, fmt.Errorf("health interval %s: must not be negative", c.HealthInterval))
	}
	if c.MaxHeaderListSize < 1024 || c.MaxHeaderListSize > 1<<20 {
		errs = append(errs, fmt.Errorf("header list size %d: want 1024 to 1048576 bytes", c.MaxHeaderListSize))
	}
	if c.MaxConcurrentStreams < 1 || c.MaxConcurrentStreams > 1<<16 {
		errs = append(errs, fmt.Errorf("concurrent streams %d: want 1 to 65536", c.MaxConcurrentStreams))
	}
	if c.IdleTimeout < 0 || c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("idle timeout %s, handshake timeout %s: must not be negative", c.IdleTimeout, c.HandshakeTimeout))
	}
	if c.MaxWatches < 0 {
		errs = append(errs, fmt.Errorf("health watches %d: must not be negative", c.MaxWatches))
	}
	return errors.Join(errs...)
}

// ServerOptions returns the grpc.Server options the ingress relies on: the
// message limits (default 4 MiB received, as the HTTP body limit, and
// 16 MiB sent), the header list and concurrent stream bounds, the
// handshake and idle timeouts, and keepalive enforcement. grpc-go's
// defaults bound none of these usefully.
func ServerOptions(cfg Config) []grpc.ServerOption {
	cfg.setDefaults()
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(cfg.MaxSendMsgSize),
		grpc.MaxHeaderListSize(uint32(cfg.MaxHeaderListSize)),
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: cfg.IdleTimeout,
			Time:              keepaliveTime,
			Timeout:           keepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             keepaliveMinTime,
			PermitWithoutStream: true,
		}),
	}
}

// Server implements switchyard.v1.Switchyard on a Backend.
type Server struct {
	switchyardv1.UnimplementedSwitchyardServer

	cfg     Config
	backend Backend
	log     *slog.Logger
	health  *healthService
}

var _ switchyardv1.SwitchyardServer = (*Server)(nil)

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New returns the ingress for backend. cfg should be valid (see
// Config.Validate); zero fields take the defaults.
func New(backend Backend, cfg Config, opts ...Option) *Server {
	cfg.setDefaults()
	s := &Server{cfg: cfg, backend: backend, log: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	s.health = newHealthService(backend.Ready, cfg.HealthInterval, cfg.MaxWatches)
	return s
}

// Register registers the Switchyard service, grpc.health.v1 and server
// reflection on gs. Create gs with ServerOptions(cfg) among its options.
func (s *Server) Register(gs *grpc.Server) {
	switchyardv1.RegisterSwitchyardServer(gs, s)
	healthpb.RegisterHealthServer(gs, s.health)
	reflection.Register(gs)
}

// Shutdown makes the health service report NOT_SERVING from now on, so that
// load balancers stop sending before the grpc.Server's GracefulStop.
func (s *Server) Shutdown() { s.health.Shutdown() }

// Chat streams a chat completion.
func (s *Server) Chat(req *switchyardv1.ChatRequest, stream grpc.ServerStreamingServer[switchyardv1.StreamResponse]) error {
	return s.serve(stream, wire.API_API_CHAT, req.GetModel(), req.GetIncludeUsage(), req.SloTtftMs, req.SloItlMs, func() ([]byte, error) { return chatBody(req) })
}

// Complete streams a text completion.
func (s *Server) Complete(req *switchyardv1.CompletionRequest, stream grpc.ServerStreamingServer[switchyardv1.StreamResponse]) error {
	return s.serve(stream, wire.API_API_COMPLETION, req.GetModel(), req.GetIncludeUsage(), req.SloTtftMs, req.SloItlMs, func() ([]byte, error) { return completionBody(req) })
}

// ListModels returns the models with a live agent.
func (s *Server) ListModels(context.Context, *switchyardv1.ListModelsRequest) (*switchyardv1.ListModelsResponse, error) {
	names := s.backend.Models()
	out := &switchyardv1.ListModelsResponse{Models: make([]*switchyardv1.Model, len(names))}
	for i, m := range names {
		out.Models[i] = &switchyardv1.Model{Id: m}
	}
	return out, nil
}

// serve validates and renders one request with render, reads its latency
// targets (sloTargets), submits it and relays its chunks. The stream is always requested from the broker; the
// client's deadline becomes the job's.
func (s *Server) serve(stream grpc.ServerStreamingServer[switchyardv1.StreamResponse], api wire.API, model string, includeUsage bool, sloTTFT, sloITL *float64, render func() ([]byte, error)) error {
	ctx := stream.Context()
	rid := requestID(ctx)
	// Set before anything can fail, so that an error status carries it too.
	_ = stream.SetHeader(metadata.Pairs(HeaderRequestID, rid))
	body, err := render()
	if err != nil {
		return s.failed(ctx, rid, err)
	}
	// The rendered body is read as the HTTP ingress reads a client's: the
	// same facts, and the same refusals for what extra_json may carry.
	p, err := oaiformat.Read(api, body)
	if err != nil {
		return s.failed(ctx, rid, fromFormat(err))
	}
	targets, err := sloTargets(ctx, sloTTFT, sloITL)
	if err != nil {
		return s.failed(ctx, rid, err)
	}
	req := broker.Request{
		Model:           model,
		API:             api,
		Stream:          true,
		Body:            body,
		ClientRequestID: rid,
		Trace:           traceContext(ctx),
		NoPD:            p.NoPD != "",
		NoPDReason:      p.NoPD,
		NoMigration:     p.NoMigration,
		Format:          p,
		Class:           broker.FormatClass(p),
		Targets:         targets,
	}
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = d
	}
	call, err := s.backend.Submit(ctx, req)
	if err != nil {
		return s.failed(ctx, rid, fromBroker(err))
	}
	defer call.Close()
	_ = stream.SetHeader(metadata.Pairs(HeaderRoute, call.Route.String()))

	started := false
	// start sends the header and the StreamStart message once: at the
	// accepted chunk, or at whatever comes first should it be missing.
	start := func(c *wire.Chunk) error {
		if started {
			return nil
		}
		started = true
		if err := stream.SendHeader(metadata.Pairs(HeaderAgent, agentHeader(c))); err != nil {
			return err
		}
		return stream.Send(&switchyardv1.StreamResponse{Event: &switchyardv1.StreamResponse_Start{Start: &switchyardv1.StreamStart{
			RequestId:    rid,
			Model:        call.Model,
			Route:        call.Route.String(),
			Agent:        c.GetAgentId(),
			PrefillAgent: c.GetPrefillAgent(),
		}}})
	}
	// gone handles a failed Send: the client left or its deadline passed.
	gone := func(err error) error {
		call.SetOutcome(broker.OutcomeCancelled)
		return err
	}
	finish := ""
	for {
		c, err := call.Next(ctx)
		if err != nil {
			switch {
			case errors.Is(ctx.Err(), context.Canceled):
				// Close, deferred, cancels the engine request.
				call.SetOutcome(broker.OutcomeCancelled)
				err = ctx.Err()
			case ctx.Err() != nil:
				call.SetOutcome(broker.OutcomeError)
				err = ctx.Err()
			case errors.Is(err, broker.ErrShutdown):
				call.SetOutcome(broker.OutcomeShutdown)
			default:
				call.SetOutcome(broker.OutcomeError)
			}
			return s.failed(ctx, rid, fromBroker(err))
		}
		switch c.GetKind() {
		case wire.Chunk_KIND_ACCEPTED:
			if err := start(c); err != nil {
				return gone(err)
			}
		case wire.Chunk_KIND_TOKEN:
			if err := start(c); err != nil {
				return gone(err)
			}
			for _, ev := range c.GetEvents() {
				if f := ev.GetFinishReason(); f != "" {
					finish = f
				}
				err := stream.Send(&switchyardv1.StreamResponse{Event: &switchyardv1.StreamResponse_Delta{Delta: &switchyardv1.StreamDelta{
					DeltaText:    ev.GetDeltaText(),
					FinishReason: ev.GetFinishReason(),
					RawChunkJson: ev.GetRaw(),
				}}})
				if err != nil {
					return gone(err)
				}
			}
		case wire.Chunk_KIND_FINAL:
			if err := start(c); err != nil {
				return gone(err)
			}
			done := &switchyardv1.StreamDone{FinishReason: c.GetFinishReason()}
			if done.FinishReason == "" {
				done.FinishReason = finish
			}
			if u := c.GetUsage(); includeUsage && u != nil {
				done.Usage = &switchyardv1.Usage{PromptTokens: u.GetPromptTokens(), CompletionTokens: u.GetCompletionTokens(), TotalTokens: u.GetTotalTokens()}
				done.RawChunkJson = c.GetRaw()
			}
			if err := stream.Send(&switchyardv1.StreamResponse{Event: &switchyardv1.StreamResponse_Done{Done: done}}); err != nil {
				return gone(err)
			}
			return nil
		case wire.Chunk_KIND_ERROR:
			return s.failed(ctx, rid, fromWire(c.GetError()))
		}
	}
}

func (s *Server) failed(ctx context.Context, rid string, st error) error {
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "grpc request failed", slog.String("request", rid), slog.Any("err", st))
	}
	return st
}

// requestID returns the client's x-request-id when it is sane, else a new one.
func requestID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(HeaderRequestID); len(v) > 0 && saneID(v[0]) {
		return v[0]
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func saneID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// traceContext passes W3C trace context metadata on to the job.
func traceContext(ctx context.Context) map[string]string {
	md, _ := metadata.FromIncomingContext(ctx)
	tp := md.Get("traceparent")
	if len(tp) == 0 || tp[0] == "" {
		return nil
	}
	m := map[string]string{"traceparent": tp[0]}
	if ts := md.Get("tracestate"); len(ts) > 0 && ts[0] != "" {
		m["tracestate"] = ts[0]
	}
	return m
}

func agentHeader(c *wire.Chunk) string {
	if p := c.GetPrefillAgent(); p != "" {
		return p + "," + c.GetAgentId()
	}
	return c.GetAgentId()
}
