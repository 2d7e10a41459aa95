package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// A job's context keeps its loop's values but not its cancel; cancelled
// with a cause, it ends with context.Canceled and context.Cause says the
// first cause given, for it and the contexts made from it.
func TestJobContextCancel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Time
	}{
		{"no deadline", time.Time{}},
		{"deadline", time.Now().Add(time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, stopParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
			ctx, cancel := jobContext(context.WithoutCancel(parent), tc.deadline)
			stopParent() // a job outlives its loop's cancel
			if ctx.Err() != nil || ctx.Value(ctxKey{}) != "v" {
				t.Fatalf("err %v, value %v", ctx.Err(), ctx.Value(ctxKey{}))
			}
			if d, ok := ctx.Deadline(); ok != !tc.deadline.IsZero() || !d.Equal(tc.deadline) {
				t.Fatalf("deadline %v %v, want %v", d, ok, tc.deadline)
			}
			ran := make(chan struct{})
			context.AfterFunc(ctx, func() { close(ran) })
			child, cancelChild := context.WithCancel(ctx)
			defer cancelChild()
			cancel(errCancelled)
			cancel(errDrainTimeout) // the first cause stays
			<-ctx.Done()
			<-child.Done()
			<-ran
			if ctx.Err() != context.Canceled || context.Cause(ctx) != errCancelled || context.Cause(child) != errCancelled {
				t.Fatalf("err %v, cause %v, child's cause %v", ctx.Err(), context.Cause(ctx), context.Cause(child))
			}
		})
	}
}

// At its deadline a job's context ends with DeadlineExceeded, as its cause
// too, and a later cancel changes nothing; one whose deadline passed
// already is born ended.
func TestJobContextDeadline(t *testing.T) {
	ctx, cancel := jobContext(context.Background(), time.Now().Add(20*time.Millisecond))
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || context.Cause(ctx) != context.DeadlineExceeded {
		t.Fatalf("err %v, cause %v", ctx.Err(), context.Cause(ctx))
	}
	cancel(errCancelled) // too late
	if context.Cause(ctx) != context.DeadlineExceeded {
		t.Fatalf("cause %v after a late cancel", context.Cause(ctx))
	}
	old, cancelOld := jobContext(context.Background(), time.Now().Add(-time.Second))
	defer cancelOld(nil)
	if old.Err() != context.DeadlineExceeded {
		t.Fatalf("a passed deadline: err %v", old.Err())
	}
}

// BenchmarkJobContext is a job's context with a deadline, the engine
// call's AfterFunc and the job's end.
func BenchmarkJobContext(b *testing.B) {
	base := context.WithoutCancel(context.Background())
	f := func() {}
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := jobContext(base, time.Now().Add(time.Hour))
		stop := context.AfterFunc(ctx, f)
		stop()
		cancel(errCancelled)
	}
}
