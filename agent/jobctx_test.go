package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

type ctxKey struct{}

// A job context cancelled with a cause: Err, Cause, Done, its AfterFunc
// functions (once each, a stopped one never), the contexts made from it
// and context.AfterFunc all behave as with the context package's own.
func TestJobCtxCancel(t *testing.T) {
	parent, stopParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	c := newJobCtx(context.WithoutCancel(parent), time.Time{})
	stopParent() // a job outlives its loop's cancel
	if c.Err() != nil || c.Value(ctxKey{}) != "v" {
		t.Fatalf("err %v, value %v", c.Err(), c.Value(ctxKey{}))
	}
	if _, ok := c.Deadline(); ok {
		t.Fatal("a deadline without one")
	}
	var ran, stopped, viaPkg atomic.Int32
	c.AfterFunc(func() { ran.Add(1) })
	stop := c.AfterFunc(func() { stopped.Add(1) })
	if !stop() || stop() {
		t.Fatal("stop before the cancel: want true once")
	}
	context.AfterFunc(c, func() { viaPkg.Add(1) })
	child, cancelChild := context.WithCancel(c)
	defer cancelChild()
	done := c.Done()
	c.cancelCause(errCancelled)
	c.cancelCause(errDrainTimeout) // the first cause stays
	select {
	case <-done:
	default:
		t.Fatal("Done not closed")
	}
	if c.Err() != context.Canceled || c.Cause() != errCancelled || causeOf(c) != errCancelled || context.Cause(c) != context.Canceled {
		t.Fatalf("err %v, cause %v, causeOf %v, context.Cause %v", c.Err(), c.Cause(), causeOf(c), context.Cause(c))
	}
	<-child.Done()
	testwait.For(t, 5*time.Second, time.Millisecond, func() error {
		if viaPkg.Load() != 1 {
			return errors.New("context.AfterFunc's function not run")
		}
		return nil
	})
	if ran.Load() != 1 || stopped.Load() != 0 {
		t.Fatalf("AfterFunc ran %d, the stopped one %d", ran.Load(), stopped.Load())
	}
	// Registered after the end: runs at once; its stop is too late.
	late := make(chan struct{})
	if c.AfterFunc(func() { close(late) })() {
		t.Fatal("stop of a function registered after the end reported true")
	}
	<-late
}

// At its deadline a job context ends with DeadlineExceeded, as its cause
// too; one whose deadline passed already is born ended.
func TestJobCtxDeadline(t *testing.T) {
	dl := time.Now().Add(20 * time.Millisecond)
	c := newJobCtx(context.Background(), dl)
	if d, ok := c.Deadline(); !ok || !d.Equal(dl) {
		t.Fatalf("deadline %v %v", d, ok)
	}
	ran := make(chan struct{})
	c.AfterFunc(func() { close(ran) })
	<-c.Done()
	<-ran
	if !errors.Is(c.Err(), context.DeadlineExceeded) || c.Cause() != context.DeadlineExceeded {
		t.Fatalf("err %v, cause %v", c.Err(), c.Cause())
	}
	c.cancelCause(errCancelled) // too late: nothing changes
	if c.Cause() != context.DeadlineExceeded {
		t.Fatalf("cause %v after a late cancel", c.Cause())
	}
	old := newJobCtx(context.Background(), time.Now().Add(-time.Second))
	if old.Err() != context.DeadlineExceeded {
		t.Fatalf("a passed deadline: err %v", old.Err())
	}
	<-old.Done()
}

// Cancels, registrations and stops from many goroutines at once (for the
// race detector): every function registered and not stopped runs once.
func TestJobCtxConcurrent(t *testing.T) {
	for range 50 {
		c := newJobCtx(context.Background(), time.Now().Add(time.Hour))
		var ran atomic.Int32
		start := make(chan struct{})
		done := make(chan bool, 8)
		for range 8 {
			go func() {
				<-start
				stop := c.AfterFunc(func() { ran.Add(1) })
				done <- stop()
			}()
		}
		go func() { <-start; c.cancelCause(errCancelled) }()
		close(start)
		var kept int32
		for range 8 {
			if !<-done {
				kept++ // stopped too late: it ran, or runs
			}
		}
		testwait.For(t, 5*time.Second, time.Millisecond, func() error {
			if ran.Load() != kept {
				return errors.New("not every function ran")
			}
			return nil
		})
	}
}

// A job's context, its deadline and the engine call's AfterFunc cost a
// few allocations: the context, its timer, the registration's stop.
func TestJobCtxAllocs(t *testing.T) {
	base := context.WithoutCancel(context.Background())
	f := func() {}
	allocs := testing.AllocsPerRun(200, func() {
		c := newJobCtx(base, time.Now().Add(time.Hour))
		cancel := context.CancelCauseFunc(c.cancelCause)
		stop := c.AfterFunc(f)
		stop()
		cancel(errCancelled)
	})
	t.Logf("%.1f allocations", allocs)
	if allocs > 4 {
		t.Fatalf("a job's context: %.1f allocations, want at most 4", allocs)
	}
}
