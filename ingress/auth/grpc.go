package auth

import (
	"context"
	"net/netip"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// exemptPrefixes are the full-method prefixes of the services callable
// without a key: the standard health service, which probes call, and server
// reflection, which tools such as grpcurl call before any method to learn
// the schema. Reflection answers only with the descriptors of the services
// the server registers (the published switchyard.v1 API and health): no
// request, model or fleet data.
var exemptPrefixes = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// UnaryInterceptor checks the "authorization: Bearer <key>" metadata of
// every unary call but those of health and reflection, answering
// codes.Unauthenticated. With no keys configured it only calls the handler.
func (k *Keys) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := k.checkGRPC(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor is UnaryInterceptor for streaming calls.
func (k *Keys) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := k.checkGRPC(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// DefaultExemptStreamsPerClient bounds the streams of health and
// reflection one client may hold open at once (see TapHandle).
const DefaultExemptStreamsPerClient = 64

// checked marks a stream's context once TapHandle has checked its key, so
// that the interceptors do not check it again.
type checked struct{}

// TapHandle returns the check grpc.InTapHandle runs as a stream's headers
// arrive, before the server spends a goroutine on the stream or reads its
// message:
//
//   - with keys configured, a stream of a method that is not exempt needs a
//     valid key (codes.Unauthenticated);
//   - a client (see ClientKey) holds at most exemptPerClient streams of the
//     exempt services, health and reflection, at once (0: no bound); past
//     it a stream gets codes.ResourceExhausted. Those streams need no key,
//     and a Watch or reflection stream lasts as long as its client wants.
//
// It returns nil when it has nothing to check. The interceptors stay in
// place and pass what it checked.
func (k *Keys) TapHandle(exemptPerClient int) tap.ServerInHandle {
	if !k.Enabled() && exemptPerClient <= 0 {
		return nil
	}
	g := &exemptStreams{max: exemptPerClient, byClient: map[netip.Prefix]int{}}
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if !exempt(info.FullMethodName) {
			if !k.Enabled() {
				return ctx, nil
			}
			if err := k.checkMD(info.Header); err != nil {
				return ctx, err
			}
			return context.WithValue(ctx, checked{}, true), nil
		}
		if g.max <= 0 {
			return ctx, nil
		}
		var key netip.Prefix
		if p, ok := peer.FromContext(ctx); ok {
			key = ClientKey(p.Addr)
		}
		if !g.acquire(key) {
			return ctx, status.Errorf(codes.ResourceExhausted, "this client holds %d health and reflection streams open, as many as the broker allows one client", g.max)
		}
		// The stream's context ends with the stream, however it ends.
		context.AfterFunc(ctx, func() { g.release(key) })
		return ctx, nil
	}
}

// exemptStreams counts the open exempt streams of each client.
type exemptStreams struct {
	max      int
	mu       sync.Mutex
	byClient map[netip.Prefix]int
}

func (g *exemptStreams) acquire(key netip.Prefix) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byClient[key] >= g.max {
		return false
	}
	g.byClient[key]++
	return true
}

func (g *exemptStreams) release(key netip.Prefix) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := g.byClient[key] - 1; n > 0 {
		g.byClient[key] = n
	} else {
		delete(g.byClient, key)
	}
}

func (k *Keys) checkGRPC(ctx context.Context, method string) error {
	if !k.Enabled() || exempt(method) || ctx.Value(checked{}) != nil {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return k.checkMD(md)
}

// checkMD checks the authorization metadata of md.
func (k *Keys) checkMD(md metadata.MD) error {
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated, "missing API key: send metadata authorization: Bearer <key>")
	}
	key, ok := bearer(vals[0])
	if !ok || len(vals) > 1 || !k.Valid(key) {
		return status.Error(codes.Unauthenticated, "incorrect API key provided")
	}
	return nil
}

func exempt(method string) bool {
	for _, p := range exemptPrefixes {
		if strings.HasPrefix(method, p) {
			return true
		}
	}
	return false
}
