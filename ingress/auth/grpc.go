package auth

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
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

func (k *Keys) checkGRPC(ctx context.Context, method string) error {
	if !k.Enabled() || exempt(method) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
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
