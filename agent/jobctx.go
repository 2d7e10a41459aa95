package agent

import (
	"context"
	"sync"
	"time"
)

// jobCtx is a job's context: its parent's values without its cancel (a
// stopping agent drains its jobs), cancelled with a cause (the broker's
// cancel, the drain timeout) or at the job's deadline. It is one
// allocation, and a timer when the job has a deadline, where
// context.WithCancelCause over context.WithoutCancel, then WithDeadline,
// made about a dozen per job: the contexts, their done channels, the
// timer context's entry in its parent's map of children, and the engine
// call's context.AfterFunc.
//
// It behaves as a context made by WithDeadline under WithCancelCause:
// Err is context.Canceled after cancel and context.DeadlineExceeded at
// the deadline, and Cause the cause given, or Err. context.Cause cannot
// see the cause (it says Err): read it with causeOf.
// Its AfterFunc method registers f without a goroutine, a context or a
// map, for context.AfterFunc and for contexts made from it (which the
// context package registers through it), and for engine adapters that
// call it directly.
type jobCtx struct {
	parent   context.Context // for values; made by context.WithoutCancel
	deadline time.Time
	timer    *time.Timer

	mu     sync.Mutex
	done   chan struct{} // made by the first Done, or closedDone
	err    error
	cause  error
	next   uint64       // the id of the next AfterFunc
	afters []afterEntry // registered and not stopped, until done
	// afterStore holds the first few: a job registers one or two.
	afterStore [2]afterEntry
}

type afterEntry struct {
	id uint64
	f  func()
}

// closedDone is the Done of a job context cancelled before anyone asked.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// init readies a zero jobCtx in place (a job's, inside its jobRun): a
// context under parent, which must carry no cancel
// (context.WithoutCancel), ending at deadline unless it is zero.
func (c *jobCtx) init(parent context.Context, deadline time.Time) {
	c.parent, c.deadline = parent, deadline
	c.afters = c.afterStore[:0]
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			c.cancel(context.DeadlineExceeded, nil)
			return
		}
		c.mu.Lock() // the timer may fire before c.timer is set
		c.timer = time.AfterFunc(d, c.expire)
		c.mu.Unlock()
	}
}

func (c *jobCtx) expire() { c.cancel(context.DeadlineExceeded, nil) }

// cancelCause ends the context with cause (context.Canceled if nil), as
// a context.CancelCauseFunc does.
func (c *jobCtx) cancelCause(cause error) { c.cancel(context.Canceled, cause) }

// cancel ends the context with err, and with cause (err if nil), once;
// then runs the functions registered with AfterFunc, in this goroutine.
func (c *jobCtx) cancel(err, cause error) {
	if cause == nil {
		cause = err
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err, c.cause = err, cause
	if c.done == nil {
		c.done = closedDone
	} else {
		close(c.done)
	}
	afters := c.afters
	c.afters = nil
	t := c.timer
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	for _, a := range afters {
		a.f()
	}
}

func (c *jobCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *jobCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

func (c *jobCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Cause returns why the context ended, nil while it has not.
func (c *jobCtx) Cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

// Value looks key up in the parent. The parent has no cancel, so the
// context package finds no cancelCtx through it: context.Cause asks Err,
// and children register through AfterFunc.
func (c *jobCtx) Value(key any) any { return c.parent.Value(key) }

// AfterFunc arranges for f to run once the context is done, in the
// goroutine that ends it (at once, in its own, if it is done already);
// f must not block. stop unregisters f and reports whether it did so
// before f was started.
func (c *jobCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	id := c.next
	c.next++
	c.afters = append(c.afters, afterEntry{id: id, f: f})
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, a := range c.afters {
			if a.id == id {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false
	}
}

func (c *jobCtx) String() string { return "agent.jobCtx" }

// causeOf is context.Cause, read from a job context directly.
func causeOf(ctx context.Context) error {
	if c, ok := ctx.(*jobCtx); ok {
		return c.Cause()
	}
	return context.Cause(ctx)
}

var _ context.Context = (*jobCtx)(nil)
