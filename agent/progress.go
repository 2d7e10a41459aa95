package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/switchyard-ai/switchyard/wire"
)

// errEngineStalled is the cause of an engine request the progress watch
// ended (see Config.ProgressTimeout).
var errEngineStalled = errors.New("engine stalled")

// progressWatch ends an engine request that stops producing events: no
// first event within first of the request, or none within every of the
// one before. It counts the stream's events (one atomic add per event in
// emit) rather than moving a timer per event: a check that finds the count
// where the last one left it ends the request, so a silence is noticed
// within twice every. Only its timer's goroutine runs tick.
type progressWatch struct {
	out          *stream
	cancel       context.CancelCauseFunc
	first, every time.Duration
	seen         uint64
	t            *time.Timer
}

// watchProgress starts the progress watch of out's engine request, which
// cancel ends; stop ends the watch.
func (a *Agent) watchProgress(out *stream, cancel context.CancelCauseFunc) (stop func()) {
	w := &progressWatch{out: out, cancel: cancel, first: a.cfg.FirstEventTimeout, every: a.cfg.ProgressTimeout}
	d := w.first
	if d <= 0 {
		d = w.every
	}
	if d <= 0 {
		return func() {}
	}
	w.t = time.AfterFunc(d, w.tick)
	return func() { w.t.Stop() }
}

func (w *progressWatch) tick() {
	n := w.out.events.Load()
	switch {
	case n == 0 && w.first > 0:
		w.cancel(fmt.Errorf("%w: no event within %s of the request (--engine-first-event-timeout)", errEngineStalled, w.first))
		return
	case n != 0 && n == w.seen:
		w.cancel(fmt.Errorf("%w: no event for %s (--engine-progress-timeout)", errEngineStalled, w.every))
		return
	}
	if w.every <= 0 {
		return // no bound between events
	}
	w.seen = n
	w.t.Reset(w.every)
}

// stalledError turns the error of an engine request the progress watch
// ended (ctx is the request's) into its wire error; others are left as
// they are.
func stalledError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, errEngineStalled) {
		return &wire.Error{Code: wire.CodeEngineStalled, Message: cause.Error()}
	}
	return err
}
