package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// consumerCause adds to err, a failure to create or bind the durable
// consumer name, why JetStream did not answer, as far as the agent can
// learn it: the permission the server denied (a refused request gets no
// answer; only the connection's last error says why), or what the
// consumer's info says (no leader: its replicas cannot agree, as on a
// replicated stream whose storage the servers cannot give), or that the
// info went unanswered too. An error JetStream answered with is returned as
// it is, with its code.
func (a *Agent) consumerCause(ctx context.Context, stream, name string, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return fmt.Errorf("%w (JetStream error %d)", err, apiErr.ErrorCode)
	}
	if last := a.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
		return fmt.Errorf("%w (%v: check that this agent's NATS user may serve --role %s)", err, last, a.cfg.Pool)
	}
	if ctx.Err() != nil {
		return err
	}
	ictx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cons, ierr := a.js.Consumer(ictx, stream, name)
	switch {
	case errors.As(ierr, &apiErr):
		return fmt.Errorf("%w (consumer info: %s, JetStream error %d)", err, apiErr.Description, apiErr.ErrorCode)
	case ierr != nil:
		if last := a.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
			return fmt.Errorf("%w (%v: check that this agent's NATS user may serve --role %s)", err, last, a.cfg.Pool)
		}
		return fmt.Errorf("%w (JetStream does not answer about the consumer either: %v; the stream %s or the cluster's meta leader may have no quorum)", err, ierr, stream)
	}
	info := cons.CachedInfo()
	if info.Cluster != nil && info.Cluster.Leader == "" {
		return fmt.Errorf("%w (consumer %s has no leader: its replicas cannot agree; the stream %s may have a storage or replica count the servers cannot serve, e.g. memory where max_memory_store is 0: see the brokers' /readyz)", err, name, stream)
	}
	return err
}
