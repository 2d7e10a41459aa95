package grpcapi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// invalid is an INVALID_ARGUMENT status for a request the ingress refuses.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// fromFormat maps a refusal of oaiformat.Read to INVALID_ARGUMENT. A
// member the typed fields cannot set came from extra_json, and the message
// says so.
func fromFormat(err error) error {
	var fe *oaiformat.Error
	if errors.As(err, &fe) && fe.Code == "reserved_field" {
		return status.Errorf(codes.InvalidArgument, "extra_json must not set %q: %s", fe.Param, fe.Message)
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// retryable attaches a RetryInfo detail, the gRPC counterpart of HTTP's
// Retry-After.
func retryable(c codes.Code, msg string, after time.Duration) error {
	st := status.New(c, msg)
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)}); err == nil {
		return d.Err()
	}
	return st.Err()
}

// fromBroker maps the errors of Submit and Call.Next to a gRPC status. This
// and fromWire are the only places where Switchyard errors meet gRPC codes.
func fromBroker(err error) error {
	var we *wire.Error
	switch {
	case errors.Is(err, broker.ErrNoModel):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, broker.ErrUnknownModel):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, broker.ErrQueueFull):
		return retryable(codes.ResourceExhausted, err.Error(), time.Second)
	case errors.Is(err, broker.ErrNoCapacity), errors.Is(err, broker.ErrNotConnected), errors.Is(err, broker.ErrClosed), errors.Is(err, broker.ErrQueueTimeout), errors.Is(err, broker.ErrShutdown):
		return retryable(codes.Unavailable, err.Error(), time.Second)
	case errors.Is(err, broker.ErrUnsupported):
		return retryable(codes.Unavailable, err.Error(), 5*time.Second)
	case errors.Is(err, broker.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, broker.ErrAnswerTooLarge):
		// A bound, not a failure a retry would escape: no retry advice.
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, broker.ErrStalled), errors.Is(err, broker.ErrStreamBroken), errors.Is(err, broker.ErrSlowReader):
		// The output may be partial; a retry of the whole request is safe.
		return status.Error(codes.Unavailable, err.Error())
	case errors.As(err, &we):
		return fromWire(we)
	}
	return status.Error(codes.Internal, err.Error())
}

// fromWire maps an agent's error chunk to a gRPC status.
func fromWire(we *wire.Error) error {
	msg := we.GetMessage()
	switch we.GetCode() {
	case wire.CodeBadRequest:
		if we.GetHttpStatus() == 404 {
			return status.Error(codes.NotFound, msg)
		}
		return status.Error(codes.InvalidArgument, msg)
	case wire.CodeDeadlineExceeded:
		return status.Error(codes.DeadlineExceeded, msg)
	case wire.CodeCancelled:
		return status.Error(codes.Canceled, msg)
	case wire.CodeQueueFull:
		return retryable(codes.ResourceExhausted, msg, time.Second)
	case wire.CodeEngineDown, wire.CodeEngineStalled, wire.CodeDraining, wire.CodeHandoffExpired:
		return retryable(codes.Unavailable, msg, time.Second)
	case wire.CodeEngine:
		return status.Error(codes.Unavailable, msg)
	case wire.CodeEngineOutputTooLarge:
		return status.Error(codes.ResourceExhausted, msg)
	}
	return status.Error(codes.Internal, we.GetCode()+": "+msg)
}
