package natsx

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream error codes that nats.go's jetstream names no constant for
// (nats-server's server.JSClusterNotAvailErr and server.JSStreamStoreFailedF).
const (
	// CodeClusterNotAvail: "JetStream system temporarily unavailable",
	// while a cluster elects a leader.
	CodeClusterNotAvail jetstream.ErrorCode = 10008
	// CodeStreamStoreFailed: the stream did not store a message; with
	// discard-new and a bound per subject, "maximum messages per subject
	// exceeded".
	CodeStreamStoreFailed jetstream.ErrorCode = 10077
)

// NotNow reports whether a JetStream request failed for a reason that
// passes by itself on a cluster that lost a node: no responders or no
// answer while a stream leader is elected, NATS reconnecting to another
// node, JetStream not yet back on a node that restarted. A full queue is
// not one of them (QueueFull), nor a connection closed for good.
func NotNow(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case CodeClusterNotAvail, jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
			return true
		}
		return false
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrStaleConnection)
}

// QueueFull reports whether a publish failed because its subject's queue
// is at its bound (a stream with discard-new and a bound per subject).
func QueueFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == CodeStreamStoreFailed
}
