package auth

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// healthPrefix is the full-method prefix of the standard health service,
// which probes call without a key.
const healthPrefix = "/grpc.health.v1.Health/"

// UnaryInterceptor checks the "authorization: Bearer <key>" metadata of
// every unary call but the grpc.health.v1 ones, answering
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
	if !k.Enabled() || strings.HasPrefix(method, healthPrefix) {
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
