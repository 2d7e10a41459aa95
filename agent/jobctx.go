package agent

import (
	"context"
	"time"
)

// jobContext returns a job's context: base's values without its cancel (a
// stopping agent drains its jobs; base comes from context.WithoutCancel),
// ended by cancel with a cause (the broker's cancel, the drain timeout) or
// at deadline unless it is zero. Err is context.Canceled after cancel and
// context.DeadlineExceeded at the deadline; context.Cause is the cause
// given, or Err, whichever came first.
func jobContext(base context.Context, deadline time.Time) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(base)
	if deadline.IsZero() {
		return ctx, cancel
	}
	dctx, stop := context.WithDeadline(ctx, deadline)
	return dctx, func(cause error) {
		cancel(cause)
		stop()
	}
}
